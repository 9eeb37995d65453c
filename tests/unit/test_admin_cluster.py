"""The admin operations in cluster mode, in-process: two brokers with their ClusterNodes sharing one
in-memory metadata store (leases, watches and transactions as etcd would give them)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ister.broker.admin_ops import AdminOps
from ister.broker.service import BrokerService
from ister.cluster.mode import ClusterMode
from ister.cluster.node import ClusterNode
from ister.config import load_config
from ister.core.cluster.assignment import Marker
from ister.core.dispatch import SubType
from ister.errors import AlreadyExists, FailedPrecondition, NotFound
from ister.ids import TopicName
from ister.metadata import keys
from ister.metadata.embedded import EmbeddedStore
from ister.metadata.store import Compare, Delete, Put
from ister.ports.placement_admin import FOLLOWER_ROLE, LEADER_ROLE
from ister.storage.topic_storage import TopicStorage
from tests.support import until


class Node:
    def __init__(self, broker: BrokerService, cluster: ClusterNode) -> None:
        self.broker = broker
        self.cluster = cluster
        self.ops = AdminOps(broker)

    @property
    def id(self) -> int:
        return self.cluster.broker_id


async def start_member(
    store: EmbeddedStore, data: Path, broker_addr: str, admin_addr: str, **overrides: object
) -> tuple[BrokerService, ClusterNode]:
    """One cluster broker in this process (lease TTL 3 s) on the shared store, started."""
    config = load_config(
        overrides={
            "mode": "cluster",
            "broker_addr": broker_addr,
            "admin_addr": admin_addr,
            "cluster.lease_ttl_seconds": 3,
            # in-process members serve no gRPC, so nobody could follow a replicated topic: one copy
            "cluster.replication_factor": 1,
            **overrides,
        },
        environ={},
    )
    await asyncio.to_thread(data.mkdir)
    storage = TopicStorage(config, store, data)
    mode = ClusterMode(config, store, storage, data)
    broker = BrokerService(config, store, data, mode.placement, storage, mode.placement_admin)
    await broker.start()
    await broker.placement.start()
    return broker, mode.node


@pytest.fixture
async def nodes(tmp_path: Path) -> AsyncIterator[list[Node]]:
    store = EmbeddedStore.in_memory()
    out: list[Node] = []
    for i in range(2):
        addrs = f"127.0.0.1:{7000 + i}", f"127.0.0.1:{7100 + i}"
        broker, cluster = await start_member(store, tmp_path / f"b{i}", *addrs)
        out.append(Node(broker, cluster))
    await until(lambda: out[0].cluster.leader() is not None, "a leader")
    try:
        yield out
    finally:
        for node in out:
            await node.broker.close()
            await close_cluster(node.cluster, node.broker)
        await store.close()


async def close_cluster(cluster: ClusterNode, broker: BrokerService | None = None) -> None:
    """`ClusterNode.close()` (through the broker's placement, when given), re-cancelling its loops until they
    end.

    On Python 3.11 `asyncio.wait_for` returns normally, swallowing the cancellation, when the awaited event
    was set just before the cancel arrives; `ClusterNode._run` then loops on and `close()` waits for ever.
    """
    closing = asyncio.ensure_future(broker.placement.close() if broker is not None else cluster.close())
    while not closing.done():
        for task in cluster._tasks:
            task.cancel()
        await asyncio.sleep(0.05)
    await closing


def owner(nodes: list[Node], topic: str) -> Node | None:
    for node in nodes:
        if topic in node.broker.topics:
            return node
    return None


async def test_create_is_assigned_and_listed_with_exact_owners(nodes: list[Node]) -> None:
    a = nodes[0].ops
    created = await a.create_topic("/default/t", reliable=True)
    assert created == ["/default/t"]
    await a.create_topic("/default/t2", reliable=False)
    await a.create_topic("/default/p", reliable=True, partitions=2)
    names = ["/default/p-part-0", "/default/p-part-1", "/default/t", "/default/t2"]
    await until(lambda: all(owner(nodes, n) is not None for n in names), "every topic loaded by its owner")
    infos = await a.list_namespace_topics("default")
    assert [i.name for i in infos] == names
    for info in infos:
        loaded_by = owner(nodes, info.name)
        assert loaded_by is not None and info.broker_id == loaded_by.id
    assert {i.name: i.delivery for i in infos}["/default/t2"] == "NonReliable"
    with pytest.raises(AlreadyExists):
        await nodes[1].ops.create_topic("/default/t", reliable=True)
    # Each broker's list holds exactly what it owns (asked on either broker).
    for node in nodes:
        mine = await nodes[1].ops.list_broker_topics(str(node.id))
        assert sorted(i.name for i in mine) == sorted(n for n in names if owner(nodes, n) is node)
    with pytest.raises(NotFound):
        await a.list_broker_topics("12345")
    d = await nodes[1].ops.describe_topic("/default/t")
    t_owner = owner(nodes, "/default/t")
    assert t_owner is not None and d.broker_id == t_owner.id and d.delivery == "Reliable"


async def test_brokers_and_leader(nodes: list[Node]) -> None:
    leader = await nodes[1].ops.leader()
    assert leader == nodes[0].cluster.leader()
    brokers = await nodes[0].ops.list_brokers()
    assert sorted(b.broker_id for b in brokers) == sorted(n.id for n in nodes)
    roles = {b.broker_id: b.role for b in brokers}
    assert roles[leader] == LEADER_ROLE
    assert [r for r in roles.values() if r == FOLLOWER_ROLE] == [FOLLOWER_ROLE]
    by_id = {b.broker_id: b for b in brokers}
    for i, node in enumerate(nodes):
        info = by_id[node.id]
        assert info.broker_url == f"http://127.0.0.1:{7000 + i}"
        assert info.admin_addr == f"http://127.0.0.1:{7100 + i}"
        assert info.status == "active"


async def test_delete_fences_the_owner_and_removes_metadata(nodes: list[Node]) -> None:
    a = nodes[0].ops
    await a.create_topic("/default/d", reliable=True)
    await a.create_topic("/default/d2", reliable=True)
    await until(lambda: owner(nodes, "/default/d") is not None, "the topic loaded")
    holder = owner(nodes, "/default/d")
    assert holder is not None
    await holder.broker.subscribe("/default/d", "s", "c", SubType.SHARED, [])
    # Delete through the broker that does not own it: the owner must let go by itself.
    other = nodes[1] if holder is nodes[0] else nodes[0]
    assert await other.ops.delete_topic("/default/d") == ["/default/d"]
    await until(lambda: owner(nodes, "/default/d") is None, "the owner to unload the deleted topic")
    store = holder.broker.store
    t = TopicName.parse("/default/d")
    assert await store.list(keys.topic_prefix(t)) == []
    for key in (keys.topic_root(t), keys.namespace_topic(t), keys.owner(t), keys.unassigned(t)):
        assert await store.get(key) is None, key
    assert "/default/d" not in keys.assignments(kv.key for kv in await store.list(keys.BROKERS_PREFIX))
    # The neighbour with a longer name is untouched.
    assert [i.name for i in await a.list_namespace_topics("default")] == ["/default/d2"]
    # Re-created, it is a new topic that gets an owner again.
    await a.create_topic("/default/d", reliable=True)
    await until(lambda: owner(nodes, "/default/d") is not None, "the re-created topic loaded")
    assert await a.list_subscriptions("/default/d") == []


async def test_unsubscribe_on_another_broker_names_the_owner(nodes: list[Node]) -> None:
    a = nodes[0].ops
    await a.create_topic("/default/u", reliable=True)
    await until(lambda: owner(nodes, "/default/u") is not None, "the topic loaded")
    holder = owner(nodes, "/default/u")
    assert holder is not None
    await holder.broker.subscribe("/default/u", "s", "c", SubType.SHARED, [])
    other = nodes[1] if holder is nodes[0] else nodes[0]
    with pytest.raises(FailedPrecondition, match=f"broker {holder.id}"):
        await other.ops.unsubscribe("/default/u", "s")
    await holder.ops.unsubscribe("/default/u", "s")
    assert await other.ops.list_subscriptions("/default/u") == []


async def test_unload_moves_the_topic_to_the_other_broker(nodes: list[Node]) -> None:
    a = nodes[0].ops
    await a.create_topic("/default/m", reliable=True)
    await until(lambda: owner(nodes, "/default/m") is not None, "the topic loaded")
    first = owner(nodes, "/default/m")
    assert first is not None
    assert await nodes[1].ops.unload_topic("/default/m") == ["/default/m"]
    await until(
        lambda: (o := owner(nodes, "/default/m")) is not None and o is not first,
        "the topic on the other broker",
    )
    moved = owner(nodes, "/default/m")
    assert moved is not None
    assert (await a.describe_topic("/default/m")).broker_id == moved.id


async def test_a_move_whose_owner_dies_before_sealing_is_failed_over(nodes: list[Node]) -> None:
    """The unload marker waits for the old owner to seal; when that broker dies first, nobody else can
    answer it: the leader turns it into a failover instead of leaving the topic unassigned for ever."""
    await nodes[0].ops.create_topic("/default/m", reliable=False)
    await until(lambda: owner(nodes, "/default/m") is not None, "the topic loaded", within=20)
    holder = owner(nodes, "/default/m")
    assert holder is not None
    other = nodes[1] if holder is nodes[0] else nodes[0]
    store = holder.broker.store
    # The owner stops watching (it will never answer), then the move is asked for, then it dies.
    for task in holder.cluster._tasks:
        task.cancel()
    assignment = await store.get(keys.broker_topic(holder.id, "/default/m"))
    assert assignment is not None
    marker = keys.unassigned("/default/m")
    asked = Marker(reason="unload", from_broker=holder.id, ready=False).to_json()
    assert await store.txn(
        [Compare(assignment.key, assignment.version), Compare(marker, None)],
        [Delete(assignment.key), Put(marker, asked)],
    )
    await holder.cluster.membership.close()

    async def moved() -> bool:
        return await store.get(keys.broker_topic(other.id, "/default/m")) is not None

    await until(moved, "the topic assigned to the surviving broker", within=30)
    # (The dead broker's service still holds its copy: nobody told it, as nobody can tell a dead machine.)
    await until(lambda: "/default/m" in other.broker.topics, "the survivor to load it", within=20)
