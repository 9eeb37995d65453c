"""The schema registry's reads (registry.py): subjects, versions and ids from the metadata, parsed versions
cached by (subject, version), a subject's latest version cached briefly for the publish path."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from ister.core.schema import (
    DEFAULT_JSON_RULES,
    CompatibilityMode,
    JsonRules,
)
from ister.errors import NotFound
from ister.ids import TopicName, shown
from ister.metadata import keys
from ister.metadata.cache import LocalCache
from ister.metadata.store import KeyValue, MetadataStore
from ister.schema.records import (
    SubjectSummary,
    TopicBinding,
    VersionView,
    mode_of,
    schema_of_record,
)

# Ister's mirror of every topic's schema config, one key per bound topic, followed by a watch on every
# broker so that the topic's owner applies a new policy at once (docs/metadata.md).
BINDINGS_PREFIX = "/ister/schema-bindings/"
CAS_ATTEMPTS = 50
PARSED_CACHE = 4_096  # parsed versions kept per broker
LATEST_TTL_SECONDS = 1.0  # a subject's latest version, as used for messages that name no version


class SchemaReads:
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
        return with_mode(view, mode_of(metadata))

    async def get(self, schema_id: int, version: int | None) -> VersionView:
        subject = await self.subject_of_id(schema_id)
        if version is None:
            return await self.latest(subject)
        metadata, _ = await self._metadata(subject)
        return with_mode(await self.version(subject, version, metadata), mode_of(metadata))

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


def with_mode(view: VersionView, mode: CompatibilityMode) -> VersionView:
    if view.compatibility_mode is mode:
        return view
    from dataclasses import replace

    return replace(view, compatibility_mode=mode)
