"""The metadata writes that make a topic or a namespace exist, change or go: one home for each of these
transactions, used by the broker's registry (a producer's auto-creation), the admin API and the broker's
start (bootstrap namespaces)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ister.errors import NotFound, Unavailable
from ister.ids import TopicName, shown
from ister.metadata import keys
from ister.metadata.records import ConsumerIndexRecord, TopicReplication
from ister.metadata.store import Compare, MetadataStore, Op, Put, list_all

POLICY_CAS_ATTEMPTS = 10  # a namespace policy changed by another broker meanwhile: read it again


async def create_topic(
    store: MetadataStore, name: TopicName, delivery: str, replication: TopicReplication | None = None
) -> bool:
    """Write a new topic's keys in one transaction (one metadata commit); False when it exists already.

    The replication setting is written before the topic is visible: its first load reads it."""
    ops: list[Op] = [Put(keys.topic_root(name.full), 0), Put(keys.topic_delivery(name.full), delivery)]
    if replication is not None:
        ops.append(Put(keys.topic_replication(name), replication.to_json()))
    ops.append(Put(keys.namespace_topic(name.full), None))
    return await store.txn([Compare(keys.namespace_topic(name.full), None)], ops)


async def erase_topic(store: MetadataStore, name: TopicName) -> None:
    """Every metadata trace of a deleted topic, once it is gone for lookups (`namespace_topic` deleted) and
    away from its owner. A topic created again under this name starts at offset 0 with the namespace's
    retention (and table policy) and finds none of this one's subscriptions."""
    await store.delete_prefix(keys.topic_prefix(name))
    await store.delete(keys.topic_root(name))
    await store.delete(keys.owner(name))
    await store.delete_prefix(keys.storage_topic_prefix(name))
    await store.delete(keys.start_offset(name))
    await store.delete(keys.topic_retention(name))
    await store.delete(keys.topic_rate_limits(name))
    await store.delete(keys.topic_compression(name))
    await store.delete(keys.topic_namespace_dict(name))  # the dictionary itself stays (docs/compression.md)
    await store.delete(keys.topic_table(name))  # its table stays in the catalog (docs/tables.md)
    await _erase_consumer_index(store, name, None)


async def erase_subscription(store: MetadataStore, name: TopicName, sub: str) -> None:
    """A removed subscription's keys: its record, cursor and policies, and its consumers' index entries."""
    await store.delete_prefix(keys.subscription_prefix(name, sub))
    await store.delete(keys.subscription(name, sub))
    await _erase_consumer_index(store, name, sub)


async def _erase_consumer_index(store: MetadataStore, name: TopicName, sub: str | None) -> None:
    """The consumer index entries of a topic (of one subscription of it, when `sub` is given)."""
    for kv in await list_all(store, keys.CONSUMER_INDEX_PREFIX):
        index = ConsumerIndexRecord.parse(kv.value)
        if index is not None and index.topic == name.full and sub in (None, index.subscription):
            await store.delete(kv.key)


async def create_namespace(store: MetadataStore, ns: str, policy: dict[str, Any]) -> bool:
    """Create a namespace with these policies; False when it exists already."""
    return await store.compare_and_set(keys.namespace_policy(ns), policy, expected_version=None)


async def delete_namespace(store: MetadataStore, ns: str) -> None:
    await store.delete_prefix(keys.namespace_prefix(ns))


async def update_namespace_policy(
    store: MetadataStore, ns: str, change: Callable[[dict[str, Any]], dict[str, Any]]
) -> dict[str, Any]:
    """Replace a namespace's policy document by `change(stored)` with compare-and-set, read again after a
    lost race; returns what was stored. `change` gets a copy and may raise to refuse."""
    key = keys.namespace_policy(ns)
    for _ in range(POLICY_CAS_ATTEMPTS):
        kv = await store.get(key)
        if kv is None:
            raise NotFound(f"namespace {shown(ns)} does not exist")
        value = change(dict(kv.value) if isinstance(kv.value, dict) else {})
        if await store.compare_and_set(key, value, expected_version=kv.version):
            return value
    raise Unavailable(f"the policy of namespace {shown(ns)} kept changing; retry")
