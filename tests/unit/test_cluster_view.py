"""The leader's incremental `ClusterView` must always equal what a full listing of `/cluster/` shows."""

from __future__ import annotations

import random

import pytest

from ister.cluster.view import ClusterView
from ister.core.cluster.assignment import Marker
from ister.metadata import keys
from ister.metadata.cache import LocalCache
from ister.metadata.embedded import EmbeddedStore
from ister.metadata.store import KeyValue

TOPICS = [f"/default/t{i}" for i in range(12)]
BROKERS = [1, 2, 3, 4]


def from_listing(
    entries: list[KeyValue],
) -> tuple[set[int], dict[str, int], dict[str, Marker], dict[int, str]]:
    """The reference: everything derived from one full listing, the way the leader used to do it."""
    live = set(keys.broker_ids(kv.key for kv in entries if kv.key.startswith(keys.REGISTER_PREFIX)))
    assignments = keys.assignments(kv.key for kv in entries)
    markers = {
        t: Marker.parse(kv.value)
        for kv in entries
        if (t := keys.unassigned_topic_from_key(kv.key)) is not None
    }
    modes = {}
    for kv in entries:
        for b in BROKERS:
            if kv.key == keys.broker_state(b) and isinstance(kv.value, dict):
                modes[b] = kv.value["mode"]
    return live, assignments, markers, modes


async def random_change(store: EmbeddedStore, rng: random.Random) -> None:
    topic, broker = rng.choice(TOPICS), rng.choice(BROKERS)
    roll = rng.random()
    if roll < 0.15:
        await store.put(keys.broker_register(broker), {"broker_url": "x"})
    elif roll < 0.25:
        await store.delete(keys.broker_register(broker))
    elif roll < 0.3:
        await store.put(keys.broker_state(broker), {"mode": rng.choice(["active", "draining", "drained"])})
    elif roll < 0.6:  # assign (sometimes leaving a stale key of another broker for a while)
        await store.put(keys.broker_topic(broker, topic), None)
        if rng.random() < 0.7:
            for other in BROKERS:
                if other != broker:
                    await store.delete(keys.broker_topic(other, topic))
    elif roll < 0.7:
        await store.delete(keys.broker_topic(broker, topic))
    elif roll < 0.85:
        await store.put(
            keys.unassigned(topic), rng.choice([None, {"reason": "failover", "from_broker": broker}])
        )
    else:
        await store.delete(keys.unassigned(topic))


@pytest.mark.parametrize("seed", range(8))
async def test_view_matches_a_full_listing(seed: int) -> None:
    rng = random.Random(seed)
    store = EmbeddedStore.in_memory()
    cache = LocalCache(store, [keys.CLUSTER_PREFIX], max_queue=rng.choice([4, 10_000]))
    view = ClusterView(cache)
    await cache.start()
    try:
        for _ in range(60):
            for _ in range(rng.randint(1, 8)):
                await random_change(store, rng)
            revision = await store.put("/cluster/probe", rng.random())  # wait until the cache saw it all
            assert await cache.wait_for(
                lambda r=revision: (kv := cache.get("/cluster/probe")) is not None and kv.version >= r, 5
            )
            live, assignments, markers, modes = from_listing(cache.list(keys.CLUSTER_PREFIX))
            state = view.state()
            assert state.live == live
            assert state.modes == modes
            assert state.unassigned == markers
            # A topic with two assignment keys (a stale one not yet deleted) may resolve to either key.
            assert state.assignments.keys() == assignments.keys()
            for topic, owner in state.assignments.items():
                assert cache.get(keys.broker_topic(owner, topic)) is not None
            owned = {b: n for b, n in view.owned.items() if n}
            assert owned == {
                b: list(state.assignments.values()).count(b) for b in set(state.assignments.values())
            }
            assert view.has_orphans() == any(b not in live for b in state.assignments.values())
    finally:
        await cache.close()
        await store.close()
