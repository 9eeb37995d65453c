"""The admin operations' shared part (admin_ops.py): resolving topic names and partitions, namespaces,
deliveries and owners of topics, and the replication factor a namespace's topics inherit."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from ister.broker.admin_values import (
    TopicInfo,
)
from ister.broker.compression_admin import CompressionAdmin
from ister.broker.limits_admin import LimitsAdmin
from ister.broker.retention_admin import RetentionAdmin
from ister.broker.service import BrokerService
from ister.broker.table_admin import TableAdmin
from ister.broker.topic import NON_RELIABLE, RELIABLE
from ister.core.replication import MAX_REPLICATION_FACTOR
from ister.core.replication_policy import ReplicationSetting, resolve
from ister.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
)
from ister.ids import PARTITION_MARKER, TopicName, shown, validate_segment
from ister.metadata import keys
from ister.metadata.records import (
    NamespacePolicy,
)
from ister.metadata.store import KeyValue, list_all

READ_CONCURRENCY = 32
STANDALONE_ONE_COPY = "a standalone broker keeps one copy of each topic"


def _delivery(value: Any) -> str:
    return value if value in (RELIABLE, NON_RELIABLE) else NON_RELIABLE


class AdminBase:
    def __init__(self, broker: BrokerService) -> None:
        self.broker = broker
        self.store = broker.store
        self.placement = broker.placement
        self.placement_admin = broker.placement_admin
        self._lock = asyncio.Lock()  # admin creations and deletions, one at a time
        self.retention = RetentionAdmin(self.store, self._resolve)
        self.limits = LimitsAdmin(self.store, self._resolve)
        self.compression = CompressionAdmin(self.store, self._resolve, self._is_reliable)
        self.tables = TableAdmin(
            self.store,
            self._resolve,
            lambda: broker.table_catalog,
            self._is_reliable,
            lambda: broker.config.mode == "cluster" and broker.config.tables.catalog_uri is None,
        )

    # -- lookups ------------------------------------------------------------------------------------------
    @property
    def broker_id(self) -> int:
        return self.placement.broker_id

    async def _list_all(self, prefix: str) -> list[KeyValue]:
        return await list_all(self.store, prefix)

    async def _require_namespace(self, ns: str) -> dict[str, Any]:
        validate_segment(ns, "namespace")
        kv = await self.store.get(keys.namespace_policy(ns))
        if kv is None:
            raise NotFound(f"namespace {shown(ns)} does not exist")
        return kv.value if isinstance(kv.value, dict) else {}

    async def _exists(self, name: TopicName) -> bool:
        return await self.store.get(keys.namespace_topic(name)) is not None

    async def _partitions_of(self, name: TopicName) -> list[TopicName]:
        """The `-part-N` topics of a partitioned base name, by index (exact names: `/ns/foo` never matches
        `/ns/foobar`)."""
        prefix = keys.namespace_topic(name) + PARTITION_MARKER
        found: list[tuple[int, TopicName]] = []
        for kv in await self._list_all(prefix):
            index = kv.key[len(prefix) :]
            if index.isascii() and index.isdigit() and (index == "0" or index[0] != "0"):
                found.append((int(index), name.partition_topic(int(index))))
        return [t for _, t in sorted(found, key=lambda item: item[0])]

    async def _resolve(self, raw: str) -> tuple[TopicName, list[TopicName]]:
        """(name, the topics it stands for): itself if it exists, else its partitions; NotFound if neither."""
        name = TopicName.parse(raw)
        if await self._exists(name):
            return name, [name]
        parts = await self._partitions_of(name) if name.partition is None else []
        if not parts:
            await self._require_namespace(name.namespace)
            raise NotFound(f"topic {name} does not exist")
        return name, parts

    async def resolve_topic(self, raw: str) -> tuple[TopicName, list[TopicName]]:
        """(name, the topics it stands for): a topic itself, a partitioned base name its partitions."""
        return await self._resolve(raw)

    async def require_topic(self, raw: str) -> TopicName:
        return await self._require_topic(raw)

    async def _require_topic(self, raw: str) -> TopicName:
        """An existing plain or partition topic (not a partitioned base name)."""
        name, targets = await self._resolve(raw)
        if targets != [name]:
            raise InvalidArgument(
                f"{name} is a partitioned topic; name one of its partitions ({targets[0]}, ...)"
            )
        return name

    async def _delivery_of(self, name: TopicName) -> str:
        loaded = self.broker.topics.get(name.full)
        if loaded is not None:
            return loaded.delivery
        kv = await self.store.get(keys.topic_delivery(name))
        return _delivery(kv.value if kv is not None else None)

    async def _is_reliable(self, name: TopicName) -> bool:
        return await self._delivery_of(name) == RELIABLE

    async def _deliveries(self, names: list[TopicName]) -> list[str]:
        slots = asyncio.Semaphore(READ_CONCURRENCY)

        async def one(name: TopicName) -> str:
            async with slots:
                return await self._delivery_of(name)

        return list(await asyncio.gather(*(one(n) for n in names)))

    async def _topic_infos(self, names: Iterable[str]) -> list[TopicInfo]:
        topics = [TopicName.parse(n) for n in sorted(set(names))]
        owners = await self.placement_admin.owners(topics)
        deliveries = await self._deliveries(topics)
        return [
            TopicInfo(t.full, owners.get(t.full), delivery)
            for t, delivery in zip(topics, deliveries, strict=True)
        ]

    async def _namespace_topics(self, ns: str) -> list[str]:
        return keys.topics_in_namespace(
            (kv.key for kv in await self._list_all(keys.namespace_topics_prefix(ns))), ns
        )

    def _inherited_factor(self, policy: NamespacePolicy) -> int:
        """The factor a topic of a namespace with this policy gets when it sets none itself (standalone:
        one copy, whatever is configured or stored)."""
        if self.broker.config.mode != "cluster":
            return 1
        c = self.broker.config.cluster
        layers = [
            ReplicationSetting(policy.replication_factor, policy.min_insync_replicas),
            ReplicationSetting(c.replication_factor, c.min_insync_replicas),
        ]
        return resolve(layers, MAX_REPLICATION_FACTOR).factor

    async def _admin_addr_of(self, broker_id: int) -> str:
        return await self.placement_admin.admin_addr_of(broker_id)

    def _refuse_copies_standalone(self, setting: ReplicationSetting) -> None:
        factor = setting.replication_factor
        if self.broker.config.mode != "cluster" and factor is not None and factor > 1:
            raise FailedPrecondition(f"replication_factor {factor}: {STANDALONE_ONE_COPY}")
