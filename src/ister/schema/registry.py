"""The schema registry's storage: subjects, versions and ids under the `/schemas/...` keys
(docs/metadata.md), topic bindings under `/topics/{ns}/{topic}/schema_config`.

Every write is one metadata transaction guarded by compare-and-set on the keys it read (the subject's
metadata, the id counter, the topics' configs), retried on conflict: brokers that register at once never
hand out one id twice or lose a version, and whatever fails leaves nothing half written. Versions are
immutable once written, so parsed schemas are cached by (subject, version) on every broker.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from ister.core.schema import (
    DEFAULT_JSON_RULES,
    DEFAULT_MODE,
    CompatibilityMode,
    JsonRules,
    ParsedSchema,
    SchemaType,
    ValidationPolicy,
    check,
    definition_text,
    parse,
    parse_mode_and_rules,
    parse_schema_type,
)
from ister.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable
from ister.ids import TopicName, shown
from ister.metadata import keys
from ister.metadata.cache import LocalCache
from ister.metadata.store import Compare, Delete, KeyValue, MetadataStore, Op, Put
from ister.schema.protoc import compile_proto
from ister.schema.records import (
    MAX_TAGS,
    MAX_TEXT_FIELD,
    MAX_VERSIONS_PER_SUBJECT,
    Registered,
    SubjectSummary,
    TopicBinding,
    VersionView,
    json_rules_of,
    mode_of,
    schema_of_record,
    version_record,
    version_summary,
)

log = logging.getLogger(__name__)

# Ister's mirror of every topic's schema config, one key per bound topic, followed by a watch on every
# broker so that the topic's owner applies a new policy at once (docs/metadata.md).
BINDINGS_PREFIX = "/ister/schema-bindings/"
CAS_ATTEMPTS = 50
PARSED_CACHE = 4_096  # parsed versions kept per broker
LATEST_TTL_SECONDS = 1.0  # a subject's latest version, as used for messages that name no version


def binding_key(topic: TopicName) -> str:
    return f"{BINDINGS_PREFIX}{topic.namespace}/{topic.topic}"


@functools.lru_cache(maxsize=PARSED_CACHE)
def _binding_key_of(topic: str) -> str | None:
    """`binding_key` of a topic name as sent (None if it is not one): every publish asks, and most topics
    have no binding, so the parse is kept."""
    try:
        return binding_key(TopicName.parse(topic))
    except InvalidArgument:
        return None


def _text(value: str, what: str) -> str:
    if len(value) > MAX_TEXT_FIELD:
        raise InvalidArgument(f"{what} of {len(value)} characters exceeds {MAX_TEXT_FIELD}")
    return value


class SchemaRegistry:
    def __init__(
        self,
        store: MetadataStore,
        topic_exists: Callable[[TopicName], Awaitable[bool]],
        clock: Callable[[], float] = time.time,
        json_rules: JsonRules = DEFAULT_JSON_RULES,
    ) -> None:
        self.store = store
        self.json_rules = json_rules  # for subjects that do not choose (`schema.json_compatibility`)
        self.topic_exists = topic_exists
        self._clock = clock
        self._parsed: OrderedDict[tuple[str, int], VersionView] = OrderedDict()
        self._subjects_by_id: OrderedDict[int, str] = OrderedDict()
        self._latest: dict[str, tuple[float, int]] = {}
        self._bindings_parsed: dict[str, tuple[str, KeyValue, TopicBinding]] = {}
        self.bindings = LocalCache(store, [BINDINGS_PREFIX])
        self._started: asyncio.Task[None] | None = None

    # -- lifecycle ---------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._started is None:
            self._started = asyncio.ensure_future(self.bindings.start())
        await asyncio.shield(self._started)

    async def close(self) -> None:
        await self.bindings.close()

    # -- reads -------------------------------------------------------------------------------------------
    async def _metadata(self, subject: str) -> tuple[dict[str, Any], int]:
        kv = await self.store.get(keys.schema_metadata(subject))
        if kv is None or not isinstance(kv.value, dict):
            raise NotFound(f"schema subject {shown(subject)} does not exist")
        return kv.value, kv.version

    async def subject_of_id(self, schema_id: int) -> str:
        subject = self._subjects_by_id.get(schema_id)
        if subject is not None:
            return subject
        kv = await self.store.get(keys.schema_by_id(schema_id))
        if kv is None or not isinstance(kv.value, dict) or "subject" not in kv.value:
            raise NotFound(f"schema id {schema_id} does not exist")
        subject = str(kv.value["subject"])
        self._subjects_by_id[schema_id] = subject
        if len(self._subjects_by_id) > PARSED_CACHE:
            self._subjects_by_id.popitem(last=False)
        return subject

    async def version(
        self, subject: str, version: int, metadata: dict[str, Any] | None = None
    ) -> VersionView:
        cached = self._parsed.get((subject, version))
        if cached is not None:
            self._parsed.move_to_end((subject, version))
            return cached
        if metadata is None:
            metadata, _ = await self._metadata(subject)
        kv = await self.store.get(keys.schema_version(subject, version))
        if kv is None or not isinstance(kv.value, dict):
            raise NotFound(f"version {version} of schema subject {shown(subject)} does not exist")
        record = kv.value
        schema = await asyncio.to_thread(schema_of_record, record)
        view = VersionView(
            schema_id=int(metadata.get("id", 0)),
            subject=subject,
            version=version,
            schema=schema,
            description=str(record.get("description") or ""),
            created_at=int(record.get("created_at") or 0),
            created_by=str(record.get("created_by") or ""),
            tags=[str(t) for t in record.get("tags") or ()],
            compatibility_mode=mode_of(metadata),
        )
        self._parsed[(subject, version)] = view
        if len(self._parsed) > PARSED_CACHE:
            self._parsed.popitem(last=False)
        return view

    async def latest(self, subject: str) -> VersionView:
        metadata, _ = await self._metadata(subject)
        latest = int(metadata.get("latest_version") or 0)
        if latest == 0:
            raise NotFound(f"schema subject {shown(subject)} has no versions")
        view = await self.version(subject, latest, metadata)
        return _with_mode(view, mode_of(metadata))

    async def get(self, schema_id: int, version: int | None) -> VersionView:
        subject = await self.subject_of_id(schema_id)
        if version is None:
            return await self.latest(subject)
        metadata, _ = await self._metadata(subject)
        return _with_mode(await self.version(subject, version, metadata), mode_of(metadata))

    async def latest_version_number(self, subject: str) -> int:
        """The subject's latest version, cached for LATEST_TTL_SECONDS (the publish path's lookup)."""
        now = time.monotonic()
        hit = self._latest.get(subject)
        if hit is not None and now - hit[0] < LATEST_TTL_SECONDS:
            return hit[1]
        metadata, _ = await self._metadata(subject)
        latest = int(metadata.get("latest_version") or 0)
        if len(self._latest) > PARSED_CACHE:
            self._latest.clear()
        self._latest[subject] = (now, latest)
        return latest

    async def list_versions(self, subject: str) -> tuple[int, list[dict[str, Any]]]:
        metadata, _ = await self._metadata(subject)
        return int(metadata.get("id", 0)), list(metadata.get("versions") or [])

    async def list_subjects(self) -> list[SubjectSummary]:
        listing = await self.store.list(keys.SCHEMAS_PREFIX)
        out = []
        for kv in listing:
            if not kv.key.endswith("/metadata") or not isinstance(kv.value, dict):
                continue
            meta = kv.value
            out.append(
                SubjectSummary(
                    subject=str(meta.get("subject", "")),
                    schema_type=str(meta.get("schema_type", "")),
                    latest_version=int(meta.get("latest_version") or 0),
                    compatibility_mode=mode_of(meta),
                    schema_id=int(meta.get("id", 0)),
                )
            )
        return sorted(out, key=lambda s: s.subject)

    # -- register ------------------------------------------------------------------------------------------
    async def _parse(self, type_text: str, definition: bytes) -> tuple[ParsedSchema, bytes | None]:
        schema_type = parse_schema_type(type_text)
        text = definition_text(schema_type, definition)
        compiled = await compile_proto(text) if schema_type is SchemaType.PROTOBUF else None
        return await asyncio.to_thread(parse, schema_type, text, compiled), compiled

    async def _history(self, subject: str, metadata: dict[str, Any]) -> list[tuple[int, ParsedSchema]]:
        numbers = [int(v["version"]) for v in metadata.get("versions") or () if "version" in v]
        return [(n, (await self.version(subject, n, metadata)).schema) for n in sorted(numbers)]

    async def register(
        self,
        subject: str,
        type_text: str,
        definition: bytes,
        *,
        description: str = "",
        created_by: str = "",
        tags: list[str] | None = None,
    ) -> Registered:
        meta_key = keys.schema_metadata(subject)  # validates the subject
        tags = [_text(t, "tag") for t in (tags or [])]
        if len(tags) > MAX_TAGS:
            raise InvalidArgument(f"{len(tags)} tags exceed {MAX_TAGS}")
        _text(description, "description")
        _text(created_by, "created_by")
        schema, compiled = await self._parse(type_text, definition)
        for _ in range(CAS_ATTEMPTS):
            kv = await self.store.get(meta_key)
            now = int(self._clock())
            if kv is None:
                done = await self._create_subject(
                    subject, schema, compiled, now, created_by, description, tags
                )
                if done is not None:
                    return done
                continue
            metadata = kv.value if isinstance(kv.value, dict) else {}
            schema_id = int(metadata.get("id", 0))
            for v in metadata.get("versions") or ():
                if v.get("fingerprint") == schema.fingerprint:
                    return Registered(schema_id, int(v["version"]), False, schema.fingerprint)
            versions = list(metadata.get("versions") or [])
            if len(versions) >= MAX_VERSIONS_PER_SUBJECT:
                raise FailedPrecondition(
                    f"schema subject {shown(subject)} has {len(versions)} versions, the most allowed"
                )
            mode, rules = mode_of(metadata), json_rules_of(metadata, self.json_rules)
            errors = check(schema, await self._history(subject, metadata), mode, rules)
            if errors:
                under = f"{mode.value}" + (
                    f" ({rules.value} JSON rules)" if schema.type is SchemaType.JSON_SCHEMA else ""
                )
                raise FailedPrecondition(
                    f"schema is incompatible with subject {shown(subject)} under mode {under}: "
                    + "; ".join(errors)
                )
            version = int(metadata.get("latest_version") or 0) + 1
            record = version_record(
                version,
                schema,
                now=now,
                created_by=created_by,
                description=description,
                tags=tags,
                descriptor_set=compiled,
            )
            updated = {
                **metadata,
                "versions": [*versions, version_summary(record)],
                "latest_version": version,
                "updated_at": now,
                "schema_type": schema.type.value,
            }
            ok = await self.store.txn(
                [Compare(meta_key, kv.version), Compare(keys.schema_version(subject, version), None)],
                [Put(meta_key, updated), Put(keys.schema_version(subject, version), record)],
            )
            if ok:
                self._latest.pop(subject, None)
                log.info(
                    "schema registry: %s version %d registered (%s)", subject, version, schema.fingerprint
                )
                return Registered(schema_id, version, True, schema.fingerprint)
        raise Unavailable(f"schema subject {shown(subject)} kept changing; try again")

    async def _create_subject(
        self,
        subject: str,
        schema: ParsedSchema,
        compiled: bytes | None,
        now: int,
        created_by: str,
        description: str,
        tags: list[str],
    ) -> Registered | None:
        counter = await self.store.get(keys.schema_next_id())
        schema_id = int(counter.value) if counter is not None and isinstance(counter.value, int) else 1
        schema_id = max(schema_id, 1)
        record = version_record(
            1,
            schema,
            now=now,
            created_by=created_by,
            description=description,
            tags=tags,
            descriptor_set=compiled,
        )
        metadata = {
            "id": schema_id,
            "subject": subject,
            "versions": [version_summary(record)],
            "latest_version": 1,
            "compatibility_mode": DEFAULT_MODE.stored,
            "created_at": now,
            "created_by": created_by,
            "updated_at": now,
            "topics_using": [],
            "schema_type": schema.type.value,
        }
        ok = await self.store.txn(
            [
                Compare(keys.schema_metadata(subject), None),
                Compare(keys.schema_next_id(), counter.version if counter is not None else None),
                Compare(keys.schema_by_id(schema_id), None),
            ],
            [
                Put(keys.schema_next_id(), schema_id + 1),
                Put(keys.schema_metadata(subject), metadata),
                Put(keys.schema_version(subject, 1), record),
                Put(keys.schema_by_id(schema_id), {"schema_id": schema_id, "subject": subject}),
                Put(keys.schema_compatibility(subject), {"mode": DEFAULT_MODE.value}),
            ],
        )
        if not ok:
            return None
        log.info("schema registry: subject %s created with id %d", subject, schema_id)
        return Registered(schema_id, 1, True, schema.fingerprint)

    async def check_compatibility(
        self, subject: str, type_text: str, definition: bytes, mode_text: str | None
    ) -> list[str]:
        metadata, _ = await self._metadata(subject)
        mode, rules = mode_of(metadata), json_rules_of(metadata, self.json_rules)
        if mode_text:
            mode, chosen = parse_mode_and_rules(mode_text)
            rules = chosen or rules
        schema, _ = await self._parse(type_text, definition)
        return check(schema, await self._history(subject, metadata), mode, rules)

    # -- changes -------------------------------------------------------------------------------------------
    async def set_mode(self, subject: str, mode_text: str) -> CompatibilityMode:
        """`mode_text` is a mode, optionally with `:danube` or `:strict` (the subject's JSON rules)."""
        mode, rules = parse_mode_and_rules(mode_text)
        meta_key = keys.schema_metadata(subject)
        for _ in range(CAS_ATTEMPTS):
            metadata, version = await self._metadata(subject)
            updated = {**metadata, "compatibility_mode": mode.stored, "updated_at": int(self._clock())}
            if rules is not None:
                updated["json_compatibility"] = rules.value
            ok = await self.store.txn(
                [Compare(meta_key, version)],
                [Put(meta_key, updated), Put(keys.schema_compatibility(subject), {"mode": mode.value})],
            )
            if ok:
                for key in [k for k in self._parsed if k[0] == subject]:
                    del self._parsed[key]
                return mode
        raise Unavailable(f"schema subject {shown(subject)} kept changing; try again")

    async def delete_version(self, subject: str, version: int) -> None:
        """Delete one version; refused while topics use the subject (their producers and consumers resolve
        its versions) and for the only version left (delete nothing rather than leave an empty subject)."""
        meta_key = keys.schema_metadata(subject)
        version_key = keys.schema_version(subject, version)
        for _ in range(CAS_ATTEMPTS):
            metadata, meta_version = await self._metadata(subject)
            versions = list(metadata.get("versions") or [])
            if not any(int(v.get("version", -1)) == version for v in versions):
                raise NotFound(f"version {version} of schema subject {shown(subject)} does not exist")
            using = list(metadata.get("topics_using") or [])
            if using:
                raise FailedPrecondition(
                    f"version {version} of schema subject {shown(subject)} is in use by topic(s) "
                    f"{', '.join(using[:5])}: bind them to another subject first"
                )
            if len(versions) == 1:
                raise FailedPrecondition(
                    f"version {version} is the only version of schema subject {shown(subject)}"
                )
            kept = [v for v in versions if int(v.get("version", -1)) != version]
            latest = max(int(v["version"]) for v in kept)
            updated = {
                **metadata,
                "versions": kept,
                "latest_version": latest,
                "updated_at": int(self._clock()),
            }
            version_kv = await self.store.get(version_key)
            ops: list[Op] = [Put(meta_key, updated)]
            compares = [Compare(meta_key, meta_version)]
            if version_kv is not None:
                ops.append(Delete(version_key))
                compares.append(Compare(version_key, version_kv.version))
            if await self.store.txn(compares, ops):
                self._parsed.pop((subject, version), None)
                self._latest.pop(subject, None)
                return
        raise Unavailable(f"schema subject {shown(subject)} kept changing; try again")

    # -- topics --------------------------------------------------------------------------------------------
    def binding(self, topic: str) -> TopicBinding | None:
        """The topic's binding as this broker's watch last saw it (no I/O: the publish path)."""
        hit = self._bindings_parsed.get(topic)
        key = hit[0] if hit is not None else _binding_key_of(topic)
        if key is None:
            return None
        kv = self.bindings.get(key)
        if kv is None or kv.value is None:
            return None
        if hit is not None and hit[1] is kv:
            return hit[2]
        binding = TopicBinding.from_json(kv.value)
        if len(self._bindings_parsed) > PARSED_CACHE:
            self._bindings_parsed.clear()
        self._bindings_parsed[topic] = (key, kv, binding)
        return binding

    async def topic_binding(self, topic: str) -> TopicBinding | None:
        name = TopicName.parse(topic)
        kv = await self.store.get(keys.topic_schema_config(name))
        return TopicBinding.from_json(kv.value) if kv is not None and kv.value else None

    async def bind_topic(
        self,
        topic: str,
        subject: str,
        policy: ValidationPolicy,
        payload_validation: bool,
        *,
        only_if_unbound: bool = False,
    ) -> TopicBinding:
        """Bind a topic to a subject with a policy (ConfigureTopicSchema, admin CreateTopic, a producer
        naming a subject for an unbound topic). The topic must exist; so must the subject."""
        name = TopicName.parse(topic)
        if not await self.topic_exists(name):
            raise NotFound(f"topic {name} does not exist")
        config_key = keys.topic_schema_config(name)
        for _ in range(CAS_ATTEMPTS):
            metadata, meta_version = await self._metadata(subject)
            current = await self.store.get(config_key)
            previous = (
                TopicBinding.from_json(current.value) if current is not None and current.value else None
            )
            if only_if_unbound and previous is not None:
                if previous.subject != subject:
                    raise FailedPrecondition(
                        f"topic {name} uses schema subject {shown(previous.subject)}, not {shown(subject)}"
                    )
                return previous
            binding = TopicBinding(subject, int(metadata.get("id", 0)), policy, payload_validation)
            compares = [Compare(config_key, current.version if current is not None else None)]
            using = list(metadata.get("topics_using") or [])
            ops: list[Op] = [
                Put(config_key, binding.to_json()),
                Put(keys.topic_schema_subject(name), subject),
                Put(binding_key(name), binding.to_json()),
            ]
            if name.full not in using:
                compares.append(Compare(keys.schema_metadata(subject), meta_version))
                ops.append(
                    Put(keys.schema_metadata(subject), {**metadata, "topics_using": [*using, name.full]})
                )
            if previous is not None and previous.subject != subject:
                old = await self.store.get(keys.schema_metadata(previous.subject))
                if old is not None and isinstance(old.value, dict):
                    old_using = [t for t in old.value.get("topics_using") or [] if t != name.full]
                    compares.append(Compare(old.key, old.version))
                    ops.append(Put(old.key, {**old.value, "topics_using": old_using}))
            if await self.store.txn(compares, ops):
                await self._seen(name, binding)
                return binding
        raise Unavailable(f"topic {name} schema config kept changing; try again")

    async def require_subject(self, subject: str) -> None:
        await self._metadata(subject)

    async def check_producer(self, topic: str, subject: str) -> None:
        """Before a producer naming `subject` attaches (CreateProducer's schema_ref): the subject is
        registered, and the topic, if bound already, is bound to it. Nothing is written."""
        try:
            await self._metadata(subject)
        except NotFound:
            raise FailedPrecondition(
                f"schema subject {shown(subject)} is not registered: register it before producing with it"
            ) from None
        current = await self.topic_binding(TopicName.parse(topic).full)
        if current is not None and current.subject != subject:
            raise FailedPrecondition(
                f"topic {topic} uses schema subject {shown(current.subject)}, not {shown(subject)}: "
                "only an admin changes a topic's subject"
            )

    async def attach_producer(self, topic: str, subject: str) -> None:
        """After the producer attached: an unbound topic is bound to its subject (policy none)."""
        if await self.topic_binding(TopicName.parse(topic).full) is None:
            await self.bind_topic(topic, subject, ValidationPolicy.NONE, False, only_if_unbound=True)

    async def update_policy(
        self, topic: str, policy: ValidationPolicy, payload_validation: bool
    ) -> TopicBinding:
        current = await self.topic_binding(topic)
        if current is None:
            raise FailedPrecondition(f"topic {shown(topic)} has no schema subject: configure one first")
        return await self.bind_topic(topic, current.subject, policy, payload_validation)

    async def _seen(self, name: TopicName, binding: TopicBinding) -> None:
        """Wait until this broker's watch shows the write, so that the next publish here obeys it."""
        expected = binding.to_json()

        def shown_here() -> bool:
            kv = self.bindings.get(binding_key(name))
            return kv is not None and kv.value == expected

        if self.bindings.ready:
            await self.bindings.wait_for(shown_here, 5.0)


def _with_mode(view: VersionView, mode: CompatibilityMode) -> VersionView:
    if view.compatibility_mode is mode:
        return view
    from dataclasses import replace

    return replace(view, compatibility_mode=mode)
