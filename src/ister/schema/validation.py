"""Payload validation on publish, by the topic's validation policy (both client APIs call `check`).

NONE: nothing is checked. ENFORCE: a record without a schema id, with the id of another subject, naming a
version that does not exist or (with payload validation) whose payload is not a value of its version's
schema fails the whole call with INVALID_ARGUMENT, before anything of it is stored. WARN: such records are
stored; each is counted (`ister_schema_validation_failures_total{policy,reason}`) and logged, at most one
line per LOG_EVERY_SECONDS.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Protocol

from prometheus_client import Counter

from ister.core.schema import ParsedSchema, ValidationPolicy
from ister.errors import InvalidArgument, NotFound
from ister.ids import shown
from ister.schema.records import TopicBinding
from ister.schema.registry import SchemaRegistry

log = logging.getLogger(__name__)

LOG_EVERY_SECONDS = 10.0

validated = Counter(
    "ister_schema_validated_messages_total", "Messages checked against their topic's schema", ["policy"]
)
failures = Counter(
    "ister_schema_validation_failures_total",
    "Messages that failed their topic's schema checks (stored under warn, refused under enforce)",
    ["policy", "reason"],
)


class Record(Protocol):
    @property
    def payload(self) -> bytes: ...
    @property
    def schema_id(self) -> int | None: ...
    @property
    def schema_version(self) -> int | None: ...


class PayloadValidator:
    def __init__(self, registry: SchemaRegistry) -> None:
        self.registry = registry
        self._last_log = 0.0
        self._suppressed = 0

    async def check(self, topic: str, records: Sequence[Record]) -> None:
        binding = self.registry.binding(topic)
        if binding is None or binding.policy is ValidationPolicy.NONE:
            return
        policy = binding.policy.value
        validated.labels(policy).inc(len(records))
        latest: int | None = None
        by_version: dict[int, tuple[list[int], list[bytes]]] = {}
        expected = binding.schema_id
        check_payloads = binding.payload_validation
        for index, record in enumerate(records):
            sid = record.schema_id
            if sid != expected:
                if sid is None:
                    self._fail(topic, binding, index, "missing_schema_id", "the message names no schema id")
                else:
                    detail = f"schema id {sid} is not the id of the topic's subject ({expected})"
                    self._fail(topic, binding, index, "subject_mismatch", detail)
                continue
            if not check_payloads:
                continue
            version = record.schema_version
            if version is None:
                if latest is None:
                    latest = await self.registry.latest_version_number(binding.subject)
                version = latest
            group = by_version.get(version)
            if group is None:
                group = by_version[version] = ([], [])
            group[0].append(index)
            group[1].append(record.payload)
        for version, (indexes, payloads) in by_version.items():
            schema = await self._schema(binding.subject, version)
            if schema is None:
                for index in indexes:
                    self._fail(topic, binding, index, "unknown_version", f"version {version} does not exist")
                continue
            start = 0
            while start < len(payloads):
                found = schema.first_invalid(payloads, start)
                if found is None:
                    break
                at, error = found
                self._fail(topic, binding, indexes[at], "payload_invalid", error)
                start = at + 1

    async def _schema(self, subject: str, version: int) -> ParsedSchema | None:
        try:
            return (await self.registry.version(subject, version)).schema
        except NotFound:
            return None

    def _fail(self, topic: str, binding: TopicBinding, index: int, reason: str, detail: str) -> None:
        failures.labels(binding.policy.value, reason).inc()
        subject = shown(binding.subject)
        message = f"message {index} does not match schema subject {subject} of topic {topic}: {detail}"
        if binding.policy is ValidationPolicy.ENFORCE:
            raise InvalidArgument(message)
        now = time.monotonic()
        if now - self._last_log >= LOG_EVERY_SECONDS:
            more = f" ({self._suppressed} more since the last warning)" if self._suppressed else ""
            log.warning("schema validation (warn): %s%s", message, more)
            self._last_log, self._suppressed = now, 0
        else:
            self._suppressed += 1
