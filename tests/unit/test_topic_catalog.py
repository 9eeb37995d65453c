"""`metadata.topic_catalog`: the one home of the topic and namespace transactions."""

from __future__ import annotations

import pytest

from ister.errors import NotFound
from ister.ids import TopicName
from ister.metadata import keys
from ister.metadata import topic_catalog as catalog
from ister.metadata.embedded import EmbeddedStore
from ister.metadata.records import TopicReplication

T = TopicName.parse("/default/t")


async def value(store: EmbeddedStore, key: str) -> object:
    kv = await store.get(key)
    return kv.value if kv is not None else None


async def test_a_topic_is_created_once_and_erased_with_every_trace() -> None:
    store = EmbeddedStore.in_memory()
    try:
        replication = TopicReplication(replication_factor=2)
        assert await catalog.create_topic(store, T, "reliable", replication)
        assert not await catalog.create_topic(store, T, "non_reliable")  # it exists: the first one stands
        assert await value(store, keys.topic_delivery(T.full)) == "reliable"
        assert await value(store, keys.topic_replication(T)) == {"replication_factor": 2}
        await store.put(keys.subscription(T, "s"), {"subscription_name": "s"})
        await store.put(keys.subscription(T, "u"), {"subscription_name": "u"})
        await catalog.erase_subscription(store, T, "s")
        assert await store.get(keys.subscription(T, "s")) is None
        assert await store.get(keys.subscription(T, "u")) is not None
        await store.delete(keys.namespace_topic(T.full))
        await catalog.erase_topic(store, T)
        assert await store.get(keys.topic_root(T.full)) is None
        assert await store.get(keys.subscription(T, "u")) is None
        assert await catalog.create_topic(store, T, "non_reliable")  # a new topic of the same name
    finally:
        await store.close()


async def test_namespace_policies_change_by_compare_and_set() -> None:
    store = EmbeddedStore.in_memory()
    try:
        assert await catalog.create_namespace(store, "ns", {"max_message_size": 10})
        assert not await catalog.create_namespace(store, "ns", {})
        stored = await catalog.update_namespace_policy(store, "ns", lambda v: {**v, "replication_factor": 3})
        assert stored == {"max_message_size": 10, "replication_factor": 3}
        assert await value(store, keys.namespace_policy("ns")) == stored
        await catalog.delete_namespace(store, "ns")
        with pytest.raises(NotFound):
            await catalog.update_namespace_policy(store, "ns", dict)
    finally:
        await store.close()
