"""Setting and reading retention limits (the admin side of docs/retention.md).

A namespace's limits live in its policy (`/namespaces/{ns}/policy`, fields `retention_time_ms` and
`retention_size_bytes`, Ister's additions), a topic's own in `/ister/retention/{ns}/{topic}`. Every broker
mirrors both by watch (`broker/retention.py`), so a change applies at each owner's next pass; nothing here
needs the topic's owner.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ister.core.retention import DEFAULT_RETENTION_TIME_MS, RetentionLimits
from ister.errors import InvalidArgument, NotFound, Unavailable
from ister.ids import TopicName, shown, validate_segment
from ister.metadata import keys
from ister.metadata.records import QUOTA_POLICIES, NamespacePolicy, TopicRetention, parse_start
from ister.metadata.store import MetadataStore

CAS_ATTEMPTS = 10


@dataclass(frozen=True, slots=True)
class RetentionInEffect:
    time_ms: int
    size_bytes: int
    time_source: str  # "topic", "namespace" or "default"
    size_source: str
    start_offset: int = 0
    quota_size_bytes: int = 0  # the namespace's backlog quota and TTL (0 = none)
    quota_time_ms: int = 0
    quota_policy: str = "producer_error"
    message_ttl_ms: int = 0


@dataclass(frozen=True, slots=True)
class BacklogSettings:
    """A namespace's backlog quota and message TTL to set; None keeps what is stored, 0 = none."""

    quota_size_bytes: int | None = None
    quota_time_ms: int | None = None
    quota_policy: str | None = None
    message_ttl_ms: int | None = None

    @property
    def empty(self) -> bool:
        return all(
            v is None
            for v in (self.quota_size_bytes, self.quota_time_ms, self.quota_policy, self.message_ttl_ms)
        )


def _checked(time_ms: int | None, size_bytes: int | None) -> None:
    RetentionLimits(time_ms or 0, size_bytes or 0)  # InvalidArgument when out of range


class RetentionAdmin:
    def __init__(
        self, store: MetadataStore, resolve: Callable[[str], Awaitable[tuple[TopicName, list[TopicName]]]]
    ) -> None:
        self.store = store
        self._resolve = resolve  # (name, its topics: itself or its partitions), NotFound when neither

    async def _namespace_policy(self, ns: str) -> tuple[dict[str, Any], int]:
        validate_segment(ns, "namespace")
        kv = await self.store.get(keys.namespace_policy(ns))
        if kv is None:
            raise NotFound(f"namespace {shown(ns)} does not exist")
        return (dict(kv.value) if isinstance(kv.value, dict) else {}), kv.version

    async def set_namespace(
        self, ns: str, time_ms: int | None, size_bytes: int | None, backlog: BacklogSettings | None = None
    ) -> RetentionInEffect:
        backlog = backlog or BacklogSettings()
        if time_ms is None and size_bytes is None and backlog.empty:
            raise InvalidArgument("nothing to set: give a retention time or size, a backlog quota or a TTL")
        _checked(time_ms, size_bytes)
        _checked(backlog.quota_time_ms, backlog.quota_size_bytes)
        _checked(backlog.message_ttl_ms, None)
        if backlog.quota_policy is not None and backlog.quota_policy not in QUOTA_POLICIES:
            raise InvalidArgument(
                f"unknown backlog quota policy {shown(backlog.quota_policy)}: "
                f"expected {', '.join(QUOTA_POLICIES)}"
            )
        key = keys.namespace_policy(ns)
        for _ in range(CAS_ATTEMPTS):
            value, version = await self._namespace_policy(ns)
            if time_ms is not None:
                value["retention_time_ms"] = time_ms
            if size_bytes is not None:
                value["retention_size_bytes"] = size_bytes
            for field, given in (
                ("backlog_quota_size_bytes", backlog.quota_size_bytes),
                ("backlog_quota_time_ms", backlog.quota_time_ms),
                ("backlog_quota_policy", backlog.quota_policy),
                ("message_ttl_ms", backlog.message_ttl_ms),
            ):
                if given is not None:
                    value[field] = given
            if await self.store.compare_and_set(key, value, expected_version=version):
                return await self.get_namespace(ns)
        raise Unavailable(f"the policy of namespace {shown(ns)} kept changing; retry")

    async def set_topic(
        self, raw: str, time_ms: int | None, size_bytes: int | None, clear: bool
    ) -> RetentionInEffect:
        """Every partition of a partitioned topic gets the same limits."""
        if clear and (time_ms is not None or size_bytes is not None):
            raise InvalidArgument("give either limits or clear, not both")
        if not clear and time_ms is None and size_bytes is None:
            raise InvalidArgument("nothing to set: give a retention time, a size, both, or clear")
        _checked(time_ms, size_bytes)
        _, targets = await self._resolve(raw)
        for name in targets:
            key = keys.topic_retention(name)
            if clear:
                await self.store.delete(key)
                continue
            kv = await self.store.get(key)
            old = TopicRetention.parse(kv.value) if kv is not None else None
            new = TopicRetention(
                retention_time_ms=time_ms
                if time_ms is not None
                else (old.retention_time_ms if old else None),
                retention_size_bytes=(
                    size_bytes if size_bytes is not None else (old.retention_size_bytes if old else None)
                ),
            )
            await self.store.put(key, new.to_json())
        return await self.get_topic(targets[0].full)

    async def get_namespace(self, ns: str) -> RetentionInEffect:
        value, _ = await self._namespace_policy(ns)
        return _in_effect(None, NamespacePolicy.lenient(value))

    async def get_topic(self, raw: str) -> RetentionInEffect:
        _, targets = await self._resolve(raw)
        name = targets[0]
        value, _ = await self._namespace_policy(name.namespace)
        kv = await self.store.get(keys.topic_retention(name))
        own = TopicRetention.parse(kv.value) if kv is not None else None
        start = parse_start(await self.store.get(keys.start_offset(name)))
        found = _in_effect(own, NamespacePolicy.lenient(value))
        return dataclasses.replace(found, start_offset=start)


def _in_effect(own: TopicRetention | None, policy: NamespacePolicy) -> RetentionInEffect:
    time_ms, time_source = DEFAULT_RETENTION_TIME_MS, "default"
    if policy.retention_time_ms is not None:
        time_ms, time_source = policy.retention_time_ms, "namespace"
    if own is not None and own.retention_time_ms is not None:
        time_ms, time_source = own.retention_time_ms, "topic"
    size, size_source = 0, "default"
    if policy.retention_size_bytes is not None:
        size, size_source = policy.retention_size_bytes, "namespace"
    if own is not None and own.retention_size_bytes is not None:
        size, size_source = own.retention_size_bytes, "topic"
    return RetentionInEffect(
        time_ms,
        size,
        time_source,
        size_source,
        quota_size_bytes=policy.backlog_quota_size_bytes or 0,
        quota_time_ms=policy.backlog_quota_time_ms or 0,
        quota_policy=policy.backlog_quota_policy or "producer_error",
        message_ttl_ms=policy.message_ttl_ms or 0,
    )
