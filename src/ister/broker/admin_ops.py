"""What the admin API does, on top of `BrokerService` and the metadata store (docs/admin.md).

Every method validates its input (`InvalidArgument`), reports a missing topic, namespace, subscription or
broker with `NotFound`, refuses to create what exists with `AlreadyExists`, and refuses a request that
conflicts with the current state with `FailedPrecondition`. Owners are found by exact topic name (the
assignment keys of `/cluster/brokers/`), listings are sorted and hold each name once.

Standalone, this broker is the only one: its id is 0 and it serves every topic (loaded on first use).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

import msgspec

from ister.broker.admin_values import (
    SubscriptionPolicy,
    TopicDescription,
    TopicInfo,
    check_dispatch_settings,
    creation_targets,
    parse_broker_id,
    policies_json,
    replication_record,
)
from ister.broker.retention_admin import RetentionAdmin
from ister.broker.service import BrokerService
from ister.broker.topic import NON_RELIABLE, RELIABLE
from ister.core.dispatch import FailurePolicy
from ister.core.replication import MAX_REPLICATION_FACTOR, ReplicaRecord, replication_state
from ister.core.replication_policy import ReplicationSetting, check_setting, resolve
from ister.core.schema import ValidationPolicy
from ister.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    IsterError,
    NotFound,
)
from ister.ids import PARTITION_MARKER, TopicName, shown, validate_client_name, validate_segment
from ister.metadata import keys
from ister.metadata import topic_catalog as catalog
from ister.metadata.records import (
    DispatchConfigRecord,
    NamespacePolicy,
    SubscriptionRecord,
)
from ister.metadata.store import KeyValue, list_all
from ister.ports.placement_admin import BrokerInfo
from ister.storage.objects import list_segments, topic_object_prefix

__all__ = [
    "NO_LEADER",
    "AdminOps",
    "SubscriptionPolicy",
    "TopicDescription",
    "TopicInfo",
    "parse_broker_id",
    "policies_json",
]

log = logging.getLogger(__name__)

READ_CONCURRENCY = 32
NO_LEADER = "not_found"
STANDALONE_ONE_COPY = "a standalone broker keeps one copy of each topic"


def _delivery(value: Any) -> str:
    return value if value in (RELIABLE, NON_RELIABLE) else NON_RELIABLE


class AdminOps:
    def __init__(self, broker: BrokerService) -> None:
        self.broker = broker
        self.store = broker.store
        self.placement = broker.placement
        self.placement_admin = broker.placement_admin
        self._lock = asyncio.Lock()  # admin creations and deletions, one at a time
        self.retention = RetentionAdmin(self.store, self._resolve)

    # -- helpers ------------------------------------------------------------------------------------------
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

    def _refuse_copies_standalone(self, setting: ReplicationSetting) -> None:
        factor = setting.replication_factor
        if self.broker.config.mode != "cluster" and factor is not None and factor > 1:
            raise FailedPrecondition(f"replication_factor {factor}: {STANDALONE_ONE_COPY}")

    # -- topics -------------------------------------------------------------------------------------------
    async def list_namespace_topics(self, ns: str) -> list[TopicInfo]:
        await self._require_namespace(ns)
        return await self._topic_infos(await self._namespace_topics(ns))

    async def list_broker_topics(self, broker_id: str | int) -> list[TopicInfo]:
        bid = parse_broker_id(broker_id) if isinstance(broker_id, str) else broker_id
        infos = await self._topic_infos(await self.placement_admin.broker_topics(bid))
        return [TopicInfo(i.name, bid, i.delivery) for i in infos]

    async def create_topic(
        self,
        raw: str,
        *,
        reliable: bool,
        partitions: int | None = None,
        schema_subject: str | None = None,
        replication: ReplicationSetting | None = None,
    ) -> list[str]:
        """Create a topic, or a partitioned topic (`{base}-part-0..N-1`); returns the topics created.

        Cluster mode: the topics are queued for the leader to assign (asynchronous, as Danube). Standalone:
        they are loaded at once. With a schema subject, the subject must be registered (checked before
        anything is created) and each topic is bound to it with policy warn and payload validation (tighten
        it with UpdateTopicValidationPolicy). A replication setting is stored with each topic, in the
        transaction that creates it (`keys.topic_replication`).
        """
        name = TopicName.parse(raw)
        if replication is not None:
            if not reliable:  # only a Reliable topic's WAL is copied: the setting would silently do nothing
                raise InvalidArgument(
                    "replication_factor and min_insync_replicas apply to Reliable topics only"
                )
            check_setting(ReplicationSetting(replication.replication_factor), 1)  # the factor's range
            self._refuse_copies_standalone(replication)
        if schema_subject:
            await self.broker.schemas.require_subject(schema_subject)
        targets = creation_targets(name, partitions)
        delivery = RELIABLE if reliable else NON_RELIABLE
        stored = replication_record(replication)
        async with self._lock:
            ns_policy = await self._require_namespace(name.namespace)
            if replication is not None:
                check_setting(replication, self._inherited_factor(NamespacePolicy.lenient(ns_policy)))
            if await self._exists(name):
                raise AlreadyExists(f"topic {name} already exists")
            if await self._partitions_of(name):
                raise AlreadyExists(f"topic {name} already exists as a partitioned topic")
            for t in targets:
                if await self._exists(t):
                    raise AlreadyExists(f"topic {t} already exists")
            # When they load here at once, over the topic limit they are refused before anything is written.
            self.placement.check_room_for_new(len(targets), f"create {len(targets)} topic(s) {name}")
            created: list[str] = []
            for t in targets:
                if not await catalog.create_topic(self.store, t, delivery, stored):  # a producer's meanwhile
                    raise AlreadyExists(f"topic {t} already exists")
                created.append(t.full)
                await self.placement.topics_created([t])
                log.info("admin: created topic %s (%s)", t, delivery)
        if self.placement.loads_new_topics_here:
            for t in targets:
                await self.broker.get_topic(t)
        if schema_subject:
            for topic in created:
                await self.broker.schemas.bind_topic(topic, schema_subject, ValidationPolicy.WARN, True)
        return created

    async def delete_topic(self, raw: str) -> list[str]:
        """Delete a topic (a partitioned base name: all its partitions) with its subscriptions and cursors;
        returns the topics deleted."""
        name = TopicName.parse(raw)
        if name.partition is not None:
            raise InvalidArgument(
                f"{name} is a partition of a partitioned topic; delete {name.namespace}/"
                f"{name.partition[0]} instead"
            )
        async with self._lock:
            _, targets = await self._resolve(raw)
            for t in targets:
                await self._delete_one(t)
        return [t.full for t in targets]

    async def _delete_one(self, name: TopicName) -> None:
        # Gone for lookups and new producers first, then away from its owner, then every trace of it.
        await self.store.delete(keys.namespace_topic(name))
        await self.placement.topic_deleted(name)
        # A load that began before the delete (a producer, a CreateTopic) finishes first: then it is
        # unloaded here, and its WAL is never removed from under it.
        async with self.broker.topic_lock(name.full):
            if name.full in self.broker.topics:
                await self.broker.unload(name.full, "deleted")
            # A topic of the same name created later must not find this one's messages.
            await self.broker.storage.remove_local(name)
        await catalog.erase_topic(self.store, name)
        await self._delete_objects(name)
        log.info("admin: deleted topic %s", name)

    async def _delete_objects(self, name: TopicName) -> None:
        """Best effort: the topic's objects in the durable tier (its metadata is gone already)."""
        objects = self.broker.objects
        if objects is None:
            return
        try:
            for _start, _end, key in await list_segments(
                objects, topic_object_prefix(name.namespace, name.topic)
            ):
                await objects.delete(key)
        except (IsterError, OSError) as exc:
            log.warning("deleted topic %s: could not remove its durable objects: %s", name, exc)

    async def unload_topic(self, raw: str) -> list[str]:
        """Unload a topic (a partitioned base name: each partition) through `BrokerService.request_unload`:
        standalone seals it here (it reloads from the sealed state on next use), cluster mode hands it to
        another broker."""
        _, targets = await self._resolve(raw)
        for t in targets:
            await self.broker.request_unload(t)
        return [t.full for t in targets]

    async def _subscriptions_of(self, name: TopicName) -> set[str]:
        listing = await self._list_all(keys.subscriptions_prefix(name))
        names = set(keys.subscription_names((kv.key for kv in listing), name))
        loaded = self.broker.topics.get(name.full)
        if loaded is not None:
            names.update(loaded.subscriptions)
        return names

    async def list_subscriptions(self, raw: str) -> list[str]:
        """Subscription names, sorted, each once (a partitioned topic: the union over its partitions)."""
        _, targets = await self._resolve(raw)
        found: set[str] = set()
        for t in targets:
            found |= await self._subscriptions_of(t)
        return sorted(found)

    async def describe_topic(self, raw: str) -> TopicDescription:
        name, targets = await self._resolve(raw)
        subscriptions = await self.list_subscriptions(raw)
        if targets == [name]:
            kv = await self.store.get(keys.topic_schema_subject(name))
            subject = kv.value if kv is not None and isinstance(kv.value, str) else None
            replicas = await self.store.get(keys.replicas(name))
            record = ReplicaRecord.parse(replicas.value) if replicas is not None else None
            state = None
            if record is not None:
                live = keys.broker_ids(kv.key for kv in await self.store.list(keys.REGISTER_PREFIX))
                state = replication_state(record, set(live))
            return TopicDescription(
                name.full,
                await self.placement_admin.owner(name),
                await self._delivery_of(name),
                subscriptions,
                schema_subject=subject,
                replication=record,
                replica_lag=self.placement_admin.replica_lag(name.full),
                attached=self._attached(name.full),
                replication_state=state,
            )
        deliveries = set(await self._deliveries(targets))
        owners = {await self.placement_admin.owner(t) for t in targets}
        return TopicDescription(
            name.full,
            owners.pop() if len(owners) == 1 else None,
            deliveries.pop() if len(deliveries) == 1 else "Mixed",
            subscriptions,
            partitions=[t.full for t in targets],
            attached=sorted({a for t in targets for a in self._attached(t.full)}),
        )

    def _attached(self, topic: str) -> list[tuple[str, str]]:
        """(subscription, consumer name) of each consumer whose stream is open here, sorted."""
        loaded = self.broker.topics.get(topic)
        if loaded is None:
            return []
        return sorted(
            (sub_name, session.name)
            for sub_name, sub in loaded.subscriptions.items()
            for session in sub.consumers.values()
            if session.attached
        )

    # -- subscriptions ------------------------------------------------------------------------------------
    async def _require_subscription(self, name: TopicName, sub: str) -> KeyValue | None:
        validate_client_name(sub, "subscription name")
        record = await self.store.get(keys.subscription(name, sub))
        loaded = self.broker.topics.get(name.full)
        if record is None and (loaded is None or sub not in loaded.subscriptions):
            raise NotFound(f"subscription {shown(sub)} does not exist on {name}")
        return record

    async def unsubscribe(self, raw: str, sub: str) -> None:
        """Remove a subscription with its cursor and policies; refused while a consumer is connected."""
        name = await self._require_topic(raw)
        await self._require_subscription(name, sub)
        if name.full not in self.broker.topics:
            owner = await self.placement_admin.owner(name)
            if owner is not None and owner != self.broker_id:
                where = await self._admin_addr_of(owner)
                raise FailedPrecondition(
                    f"{name} is served by broker {owner}; send the request to its admin API ({where})"
                )
        loaded = self.broker.topics.get(name.full)
        if loaded is not None:
            async with loaded.lock:
                await self.broker.close_idle_subscription(loaded, sub)
                loaded.untrack_cursor(sub)
                await catalog.erase_subscription(self.store, name, sub)
        else:
            await catalog.erase_subscription(self.store, name, sub)
        log.info("admin: removed subscription %s of %s", sub, name)

    async def _require_reliable(self, name: TopicName, what: str) -> None:
        if await self._delivery_of(name) != RELIABLE:
            raise FailedPrecondition(f"{what} applies to Reliable topics only; {name} is NonReliable")

    async def set_failure_policy(self, raw: str, sub: str, policy: FailurePolicy) -> None:
        """Store a subscription's failure policy (read when the subscription opens; see docs/admin.md)."""
        name = await self._require_topic(raw)
        validate_client_name(sub, "subscription name")
        await self._require_reliable(name, "a failure policy")
        if policy.poison_policy == "DeadLetter" and not (policy.dead_letter_topic or "").strip():
            raise InvalidArgument("poison policy DeadLetter needs a dead_letter_topic")
        if policy.dead_letter_topic is not None:
            TopicName.parse(policy.dead_letter_topic)
        if policy.base_redelivery_delay_ms > policy.max_redelivery_delay_ms:
            raise InvalidArgument("base_redelivery_delay_ms must be <= max_redelivery_delay_ms")
        await self.store.put(keys.subscription_failure_policy(name, sub), policy.to_json())

    async def get_failure_policy(self, raw: str, sub: str) -> SubscriptionPolicy:
        name = await self._require_topic(raw)
        validate_client_name(sub, "subscription name")
        kv = await self.store.get(keys.subscription_failure_policy(name, sub))
        record = await self.store.get(keys.subscription(name, sub))
        if kv is None and record is None:
            await self._require_subscription(name, sub)
        policy = None
        if kv is not None and isinstance(kv.value, dict):
            try:
                policy = FailurePolicy.from_json(kv.value)
            except InvalidArgument as exc:
                log.warning("stored failure policy of %s/%s is invalid: %s", name, sub, exc)
        parsed = SubscriptionRecord.parse(record.value) if record is not None else None
        return SubscriptionPolicy(policy, parsed.subscription_type if parsed is not None else 0)

    async def set_dispatch_config(
        self,
        raw: str,
        sub: str,
        max_unacked: int | None = None,
        rebalance_delay: float | None = None,
        max_handoff: float | None = None,
    ) -> None:
        """Store a subscription's dispatch settings (a partitioned base name: on each partition); None keeps
        a setting as it is. Applied at once to the subscription when it is open here."""
        check_dispatch_settings(max_unacked, rebalance_delay, max_handoff)
        _, targets = await self._resolve(raw)
        validate_client_name(sub, "subscription name")
        for name in targets:
            await self._require_reliable(name, "a dispatch config")
        for name in targets:
            key = keys.subscription_dispatch_config(name, sub)
            kv = await self.store.get(key)
            old = (DispatchConfigRecord.parse(kv.value) if kv is not None else None) or DispatchConfigRecord()
            new = DispatchConfigRecord(
                max_unacked_messages=max_unacked if max_unacked is not None else old.max_unacked_messages,
                rebalance_delay_seconds=rebalance_delay
                if rebalance_delay is not None
                else old.rebalance_delay_seconds,
                max_handoff_seconds=max_handoff if max_handoff is not None else old.max_handoff_seconds,
            )
            await self.store.put(key, new.to_json())
            loaded = self.broker.topics.get(name.full)
            open_sub = loaded.subscriptions.get(sub) if loaded is not None else None
            if open_sub is not None and max_unacked is not None:
                open_sub.set_window(max_unacked)
            part = name.partition
            if part is not None:
                groups = self.broker.consumer_refs.partition_groups
                groups.configure(f"/{name.namespace}/{part[0]}", sub, new)

    async def get_dispatch_config(self, raw: str, sub: str) -> DispatchConfigRecord | None:
        name = await self._require_topic(raw)
        validate_client_name(sub, "subscription name")
        kv = await self.store.get(keys.subscription_dispatch_config(name, sub))
        if kv is None:
            await self._require_subscription(name, sub)
            return None
        return DispatchConfigRecord.parse(kv.value)

    # -- namespaces ---------------------------------------------------------------------------------------
    async def list_namespaces(self) -> list[str]:
        return keys.namespace_names(kv.key for kv in await self._list_all(keys.NAMESPACES_PREFIX))

    async def namespace_topics(self, ns: str) -> list[str]:
        await self._require_namespace(ns)
        return await self._namespace_topics(ns)

    async def namespace_policies(self, ns: str) -> dict[str, Any]:
        return await self._require_namespace(ns)

    async def create_namespace(self, ns: str) -> None:
        validate_segment(ns, "namespace")
        policies = self.broker.config.policies
        policy = {name: getattr(policies, name) for name in policies.__struct_fields__}
        if not await catalog.create_namespace(self.store, ns, policy):
            raise AlreadyExists(f"namespace {shown(ns)} already exists")
        log.info("admin: created namespace %s", ns)

    async def set_namespace_replication(self, ns: str, setting: ReplicationSetting) -> NamespacePolicy:
        """Set a namespace's replication factor and/or minimum in-sync set by compare-and-set, keeping its
        other policies (also fields Ister does not know); returns the policy as stored."""
        factor, min_insync = setting.replication_factor, setting.min_insync_replicas
        if factor is None and min_insync is None:
            raise InvalidArgument("nothing to set: give replication_factor, min_insync_replicas or both")
        check_setting(ReplicationSetting(factor), 1)  # the factor's range, before anything is read
        self._refuse_copies_standalone(setting)
        validate_segment(ns, "namespace")

        def change(value: dict[str, Any]) -> dict[str, Any]:
            old = NamespacePolicy.lenient(value)
            check_setting(setting, self._inherited_factor(old))
            new = msgspec.structs.replace(
                old,
                replication_factor=factor if factor is not None else old.replication_factor,
                min_insync_replicas=min_insync if min_insync is not None else old.min_insync_replicas,
            )
            new_factor = self._inherited_factor(new)
            if min_insync is None and (new.min_insync_replicas or 0) > new_factor:
                raise InvalidArgument(
                    f"namespace {shown(ns)} has min_insync_replicas {new.min_insync_replicas}, more than "
                    f"replication_factor {new_factor}; give min_insync_replicas too"
                )
            # Only the fields given: the other one stays as stored (absent stays absent, not null).
            if factor is not None:
                value["replication_factor"] = factor
            if min_insync is not None:
                value["min_insync_replicas"] = min_insync
            return value

        async with self._lock:  # against a concurrent delete here; other brokers: the compare-and-set
            new = NamespacePolicy.lenient(await catalog.update_namespace_policy(self.store, ns, change))
        log.info(
            "admin: namespace %s replication factor %s, min in-sync %s",
            ns,
            new.replication_factor,
            new.min_insync_replicas,
        )
        return new

    async def delete_namespace(self, ns: str) -> None:
        async with self._lock:
            await self._require_namespace(ns)
            topics = await self._namespace_topics(ns)
            if topics:
                listed = ", ".join(topics[:5]) + (", ..." if len(topics) > 5 else "")
                raise FailedPrecondition(
                    f"namespace {shown(ns)} still has {len(topics)} topic(s) ({listed}); delete them first"
                )
            await catalog.delete_namespace(self.store, ns)
        log.info("admin: deleted namespace %s", ns)

    # -- brokers ------------------------------------------------------------------------------------------
    async def _admin_addr_of(self, broker_id: int) -> str:
        return await self.placement_admin.admin_addr_of(broker_id)

    async def leader(self) -> int | None:
        return await self.placement_admin.leader()

    async def list_brokers(self) -> list[BrokerInfo]:
        return await self.placement_admin.brokers()
