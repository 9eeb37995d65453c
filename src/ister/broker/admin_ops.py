"""What the admin API does, on top of `BrokerService` and the metadata store (docs/admin.md).

Every method validates its input (`InvalidArgument`), reports a missing topic, namespace, subscription or
broker with `NotFound`, refuses to create what exists with `AlreadyExists`, and refuses a request that
conflicts with the current state with `FailedPrecondition`. Owners are found by exact topic name (the
assignment keys of `/cluster/brokers/`), listings are sorted and hold each name once.

Standalone, this broker is the only one: its id is 0 and it serves every topic (loaded on first use).
"""

from __future__ import annotations

import logging

from ister.broker.admin_base import AdminBase
from ister.broker.admin_listing import TopicListing
from ister.broker.admin_namespaces import NamespaceAdmin
from ister.broker.admin_subscriptions import SubscriptionAdmin
from ister.broker.admin_values import (
    SubscriptionPolicy,
    TopicDescription,
    TopicInfo,
    creation_targets,
    parse_broker_id,
    policies_json,
    replication_record,
)
from ister.broker.namespace_limits import check_topic_room
from ister.broker.topic import NON_RELIABLE, RELIABLE
from ister.core.replication import ReplicaRecord, replication_state
from ister.core.replication_policy import ReplicationSetting, check_setting
from ister.core.schema import ValidationPolicy
from ister.errors import (
    AlreadyExists,
    InvalidArgument,
    IsterError,
    NotFound,
)
from ister.ids import TopicName
from ister.metadata import keys
from ister.metadata import topic_catalog as catalog
from ister.metadata.records import (
    NamespacePolicy,
)
from ister.ports.placement_admin import BrokerInfo
from ister.schema.records import VersionView
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

NO_LEADER = "not_found"


class AdminOps(TopicListing, SubscriptionAdmin, NamespaceAdmin, AdminBase):
    """Every admin operation; topics and brokers here, subscriptions and namespaces in their own modules."""

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
            await check_topic_room(self.store, name.namespace, len(targets))
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
            schema = await self._latest_schema(subject) if subject else None
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
                schema=schema,
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

    async def _latest_schema(self, subject: str) -> VersionView | None:
        try:
            return await self.broker.schemas.latest(subject)
        except NotFound:
            return None  # the subject lost its last version: the topic still names it

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

    # -- brokers ------------------------------------------------------------------------------------------
    async def leader(self) -> int | None:
        return await self.placement_admin.leader()

    async def list_brokers(self) -> list[BrokerInfo]:
        return await self.placement_admin.brokers()
