"""Setting and reading table policies (the admin side of docs/tables.md, "Policy").

A namespace's setting lives in its policy document, a topic's own in `/ister/tables/{ns}/{topic}`; every
broker mirrors both by watch (`broker/tables.py`), so a change applies at each owner's next tick. Bad input
is refused before anything is written.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ister.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable
from ister.ids import TopicName, shown, validate_segment
from ister.metadata import keys
from ister.metadata.store import MetadataStore
from ister.tables.catalog import CatalogSpec, table_ident
from ister.tables.policy import NAMESPACE_FIELDS, TablePolicy, TableSetting, in_effect

CAS_ATTEMPTS = 10


@dataclass(frozen=True, slots=True)
class TableInEffect:
    policy: TablePolicy
    catalog_uri: str
    # `namespace.table` of each of the topic's tables (each partition's); [] for a namespace and for a
    # non-reliable topic (it stores nothing, so it has no table)
    tables: list[str]
    properties: dict[str, str]  # what a reader adds to the catalog URI (warehouse, S3 endpoint), no secrets


class TableAdmin:
    def __init__(
        self,
        store: MetadataStore,
        resolve: Callable[[str], Awaitable[tuple[TopicName, list[TopicName]]]],
        spec: Callable[[], CatalogSpec],
        reliable: Callable[[TopicName], Awaitable[bool]],
        unshared: Callable[[], bool] = lambda: False,
    ) -> None:
        self.store = store
        self._resolve = resolve
        self._spec = spec
        self._reliable = reliable
        self._unshared = unshared  # a cluster whose brokers each keep their own catalog (no catalog_uri)

    def _need_shared_catalog(self, setting: TableSetting) -> None:
        """Each broker's own SQLite file would hold the tables of the topics it led: a moved topic's next
        owner would not find its table and commit its rows again into another catalog."""
        if setting.format == "iceberg" and self._unshared():
            raise FailedPrecondition(
                "tables in cluster mode need one catalog every broker shares: set tables.catalog_uri "
                "(sqlite:///path on one host, postgresql://user@host/db or a REST catalog) on every broker"
            )

    async def _namespace_policy(self, ns: str) -> tuple[dict[str, Any], int]:
        validate_segment(ns, "namespace")
        kv = await self.store.get(keys.namespace_policy(ns))
        if kv is None:
            raise NotFound(f"namespace {shown(ns)} does not exist")
        return (dict(kv.value) if isinstance(kv.value, dict) else {}), kv.version

    async def set_namespace(self, ns: str, setting: TableSetting) -> TableInEffect:
        if setting.empty:
            raise InvalidArgument("nothing to set: give a format, a partitioning and/or an interval")
        self._need_shared_catalog(setting)
        key = keys.namespace_policy(ns)
        for _ in range(CAS_ATTEMPTS):
            value, version = await self._namespace_policy(ns)
            for ours, theirs in NAMESPACE_FIELDS.items():
                given = getattr(setting, ours)
                if given is not None:
                    value[theirs] = given
            if await self.store.compare_and_set(key, value, expected_version=version):
                return await self.get_namespace(ns)
        raise Unavailable(f"the policy of namespace {shown(ns)} kept changing; retry")

    async def set_topic(self, raw: str, setting: TableSetting, clear: bool) -> TableInEffect:
        """Every partition of a partitioned topic gets the same setting; `clear` drops the topic's own."""
        if clear and not setting.empty:
            raise InvalidArgument("give either a setting or clear, not both")
        if not clear and setting.empty:
            raise InvalidArgument("nothing to set: give a format, a partitioning, an interval, or clear")
        shown_name, targets = await self._resolve(raw)
        self._need_shared_catalog(setting)
        if setting.format == "iceberg" and not await self._reliable(targets[0]):
            # accepted, it would do nothing: no committer runs for a topic without a log
            raise FailedPrecondition(f"{shown_name} is NonReliable: it stores nothing, so it has no table")
        for name in targets:
            key = keys.topic_table(name)
            if clear:
                await self.store.delete(key)
                continue
            kv = await self.store.get(key)
            old = TableSetting.from_json(kv.value if kv is not None else None)
            await self.store.put(key, old.merged(setting).to_json())
        return await self.get_topic(raw)

    async def get_namespace(self, ns: str) -> TableInEffect:
        value, _ = await self._namespace_policy(ns)
        spec = self._spec()
        policy = in_effect(None, TableSetting.of_namespace(value))
        return TableInEffect(policy, spec.public_uri(), [], _reader_properties(spec))

    async def policy_of(self, name: TopicName) -> TablePolicy:
        value, _ = await self._namespace_policy(name.namespace)
        kv = await self.store.get(keys.topic_table(name))
        own = TableSetting.from_json(kv.value) if kv is not None else None
        return in_effect(own, TableSetting.of_namespace(value))

    async def get_topic(self, raw: str) -> TableInEffect:
        _, targets = await self._resolve(raw)
        policy = await self.policy_of(targets[0])
        spec = self._spec()
        reliable = await self._reliable(targets[0])  # a partitioned topic's partitions share delivery
        tables = [".".join(table_ident(t)) for t in targets] if reliable else []
        return TableInEffect(
            policy, spec.public_uri(), tables, {"warehouse": spec.warehouse, **spec.public_properties()}
        )


def _reader_properties(spec: CatalogSpec) -> dict[str, str]:
    return {"warehouse": spec.warehouse, **spec.public_properties()}


__all__ = ["TableAdmin", "TableInEffect"]
