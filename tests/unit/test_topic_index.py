"""The topic listing's indexes (metadata/topic_index.py) over a real embedded store and its watched mirror:
pages in full-name order across namespaces, kept as topics come and go, the same after a rebuild, and the
owners' counts per broker as assignments move."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from ister.metadata import keys
from ister.metadata.cache import LocalCache
from ister.metadata.embedded import EmbeddedStore
from ister.metadata.topic_index import REBUILD_AFTER, Assignments, TopicNames
from tests.support import until


@pytest.fixture
async def store() -> AsyncIterator[EmbeddedStore]:
    s = EmbeddedStore.in_memory()
    yield s
    await s.close()


async def _cache(store: EmbeddedStore, prefix: str) -> AsyncIterator[LocalCache]:
    cache = LocalCache(store, [prefix])
    await cache.start()
    try:
        yield cache
    finally:
        await cache.close()


@pytest.fixture
async def names_cache(store: EmbeddedStore) -> AsyncIterator[LocalCache]:
    async for c in _cache(store, keys.NAMESPACES_PREFIX):
        yield c


@pytest.fixture
async def cluster_cache(store: EmbeddedStore) -> AsyncIterator[LocalCache]:
    async for c in _cache(store, keys.CLUSTER_PREFIX):
        yield c


async def make(store: EmbeddedStore, *names: str) -> None:
    for full in names:
        _, ns, topic = full.split("/")
        await store.put(keys.namespace_policy(ns), {})
        await store.put(keys.namespace_topic(f"/{ns}/{topic}"), None)


async def test_pages_follow_full_name_order_across_namespaces(
    store: EmbeddedStore, names_cache: LocalCache
) -> None:
    everything = ["/a/x", "/a/y", "/a-b/z", "/b/a", "/b/b", "/b/c"]
    await make(store, *everything)
    index = TopicNames(names_cache)
    await until(lambda: index.count() == 6, "six topics indexed")
    ordered = sorted(everything)  # "/a-b/z" before "/a/x": '-' sorts before '/'
    assert index.names() == ordered
    for offset in range(7):
        for limit in (1, 2, 4, 10):
            assert index.page("", offset, limit, False) == ordered[offset : offset + limit]
            assert index.page("", offset, limit, True) == ordered[::-1][offset : offset + limit]
    assert index.page("b", 1, 5, False) == ["/b/b", "/b/c"] and index.count("b") == 3
    assert index.namespaces() == ["a-b", "a", "b"]


async def test_changes_are_applied_and_match_a_rebuild(store: EmbeddedStore, names_cache: LocalCache) -> None:
    await make(store, "/ns/t1", "/ns/t3")
    index = TopicNames(names_cache)
    await until(lambda: index.count() == 2, "two topics indexed")
    await make(store, "/ns/t2", "/other/t0")
    await store.delete(keys.namespace_topic("/ns/t3"))
    await until(lambda: index.names() == ["/ns/t1", "/ns/t2", "/other/t0"], "the changes applied")
    await store.delete(keys.namespace_topic("/other/t0"))
    await store.delete(keys.namespace_policy("other"))
    await until(lambda: index.namespaces() == ["ns"], "an emptied namespace gone")
    fresh = TopicNames(names_cache)  # built from the mirror in one go
    assert fresh.names() == index.names() and fresh.namespaces() == index.namespaces()


async def test_a_burst_of_changes_rebuilds(store: EmbeddedStore, names_cache: LocalCache) -> None:
    index = TopicNames(names_cache)
    assert index.count() == 0
    made = [f"/bulk/t{i:05d}" for i in range(REBUILD_AFTER + 5)]
    await make(store, *made)
    await until(lambda: index.count() == len(made), "every topic indexed")
    assert index.page("", 100, 3, False) == made[100:103]


async def test_owner_counts_follow_assignments(store: EmbeddedStore, cluster_cache: LocalCache) -> None:
    await store.put(keys.broker_topic(1, "/ns/a"), None)
    await store.put(keys.broker_topic(1, "/ns/b"), None)
    await store.put(keys.broker_topic(2, "/other/c"), None)
    await store.put(keys.broker_state(1), {"mode": "active"})  # not an assignment
    owners = Assignments(cluster_cache)
    await until(lambda: owners.per_broker() == {1: 2, 2: 1}, "three assignments")
    assert owners.per_broker("ns") == {1: 2} and owners.owner("/other/c") == 2
    # /ns/b moves from broker 1 to broker 2; /ns/a loses its owner.
    await store.put(keys.broker_topic(2, "/ns/b"), None)
    await store.delete(keys.broker_topic(1, "/ns/b"))
    await store.delete(keys.broker_topic(1, "/ns/a"))
    await until(lambda: owners.per_broker() == {2: 2}, "the move and the loss applied")
    assert owners.owners(["/ns/a", "/ns/b"]) == {"/ns/a": None, "/ns/b": 2}
