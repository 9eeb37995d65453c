"""The schema registry's storage: subjects, versions and ids under the `/schemas/...` keys
(docs/metadata.md), topic bindings under `/topics/{ns}/{topic}/schema_config`.

Every write is one metadata transaction guarded by compare-and-set on the keys it read (the subject's
metadata, the id counter, the topics' configs), retried on conflict: brokers that register at once never
hand out one id twice or lose a version, and whatever fails leaves nothing half written. Versions are
immutable once written, so parsed schemas are cached by (subject, version) on every broker.

Its parts: here registering, modes and deletions; `bindings.py` topic bindings; both over
`registry_reads.py` (reads and their caches).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ister.core.schema import (
    DEFAULT_MODE,
    CompatibilityMode,
    ParsedSchema,
    SchemaType,
    check,
    definition_text,
    parse,
    parse_mode_and_rules,
    parse_schema_type,
)
from ister.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable
from ister.ids import shown
from ister.metadata import keys
from ister.metadata.store import Compare, Delete, Op, Put
from ister.schema.bindings import TopicBindings
from ister.schema.protoc import compile_proto
from ister.schema.records import (
    MAX_TAGS,
    MAX_TEXT_FIELD,
    MAX_VERSIONS_PER_SUBJECT,
    Registered,
    json_rules_of,
    mode_of,
    version_record,
    version_summary,
)
from ister.schema.registry_reads import CAS_ATTEMPTS

log = logging.getLogger(__name__)


def _text(value: str, what: str) -> str:
    if len(value) > MAX_TEXT_FIELD:
        raise InvalidArgument(f"{what} of {len(value)} characters exceeds {MAX_TEXT_FIELD}")
    return value


class SchemaRegistry(TopicBindings):
    """Subjects, versions, ids and topic bindings (see the module docstring)."""

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
