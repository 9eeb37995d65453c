"""Replication factor and minimum in-sync set per topic and per namespace (issue 16): the precedence rules
(`core.replication_policy`), their validation, and the admin operations that store them, in-process on one
cluster member over an in-memory store (the cluster test is tests/integration/test_replication_factor.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ister.broker.admin_ops import AdminOps
from ister.broker.service import BrokerService
from ister.cluster.node import ClusterNode
from ister.cluster.placement import ClusterPlacement
from ister.core.replication_policy import Replication, ReplicationSetting, check_setting, resolve
from ister.errors import InvalidArgument, NotFound
from ister.ids import TopicName
from ister.metadata import keys
from ister.metadata.embedded import EmbeddedStore
from ister.metadata.records import TopicReplication
from tests.unit.test_admin_cluster import close_cluster, start_member

S = ReplicationSetting
NONE = S()


# -- precedence (pure) ---------------------------------------------------------------------------------------


def test_the_topic_wins_over_the_namespace_and_the_broker() -> None:
    assert resolve([S(2, 1), S(3, 3), S(5, 4)], 5) == Replication(2, 2, 1)


def test_each_field_falls_back_on_its_own() -> None:
    # The topic sets only the factor: the minimum is the namespace's; the namespace's factor is unused.
    assert resolve([S(4, None), S(3, 3), S(1, None)], 5) == Replication(4, 4, 3)
    # The topic sets only the minimum: the factor is the namespace's.
    assert resolve([S(None, 1), S(3, None), S(1, None)], 5) == Replication(3, 3, 1)
    # Neither: the broker's.
    assert resolve([NONE, NONE, S(3, 3)], 5) == Replication(3, 3, 3)


def test_the_minimum_defaults_to_a_majority_of_the_factor() -> None:
    assert [resolve([S(f, None), S(1, 0)], 5).min_insync for f in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]
    # The broker's `min_insync_replicas: 0` means a majority too.
    assert resolve([NONE, NONE, S(3, 0)], 5) == Replication(3, 3, 2)


def test_the_minimum_is_capped_to_the_factor() -> None:
    # A namespace minimum of 3 under a topic factor of 2 (each valid where it was set).
    assert resolve([S(2, None), S(3, 3), S(1, 0)], 5) == Replication(2, 2, 2)


def test_copies_placed_are_capped_by_live_brokers() -> None:
    assert resolve([S(3, None), NONE, S(1, 0)], 2) == Replication(3, 2, 2)
    assert resolve([S(3, None), NONE, S(1, 0)], 1).placed == 1
    assert resolve([S(3, None), NONE, S(1, 0)], 0).placed == 1  # never below one copy


def test_out_of_range_stored_values_are_clamped_not_refused() -> None:
    assert resolve([S(9, 7), NONE, S(1, 0)], 9) == Replication(5, 5, 5)
    assert resolve([S(-2, -1), NONE, S(1, 0)], 3) == Replication(1, 1, 1)
    assert resolve([S(0, 0), S(0, 0), S(3, 0)], 3) == Replication(3, 3, 2)  # 0: not set


# -- validation (pure) ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "inherited"),
    [(S(1, None), 1), (S(5, 5), 1), (S(3, 2), 1), (S(None, 3), 3), (S(None, 1), 1), (S(2, 1), 5)],
)
def test_valid_settings_pass(setting: ReplicationSetting, inherited: int) -> None:
    check_setting(setting, inherited)


@pytest.mark.parametrize(
    ("setting", "inherited", "message"),
    [
        (S(0, None), 3, "replication_factor must be in 1..5, got 0"),
        (S(6, None), 3, "replication_factor must be in 1..5, got 6"),
        (S(2**32 - 1, None), 3, "replication_factor must be in 1..5"),
        (S(2, 3), 5, "min_insync_replicas must be in 1..2, got 3"),
        (S(3, 0), 3, "min_insync_replicas must be in 1..3, got 0"),
        (S(None, 2), 1, "min_insync_replicas must be in 1..1 (the replication factor that applies), got 2"),
    ],
)
def test_invalid_settings_are_refused(setting: ReplicationSetting, inherited: int, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_setting(setting, inherited)


# -- the admin operations on one cluster member --------------------------------------------------------------


class Member:
    def __init__(self, broker: BrokerService, node: ClusterNode) -> None:
        self.broker = broker
        self.node = node
        self.ops = AdminOps(broker)
        self.store = broker.store

    async def replication_of(self, topic: str) -> tuple[int, int, int]:
        placement = self.broker.placement
        assert isinstance(placement, ClusterPlacement)
        return await placement._replication_of(TopicName.parse(topic))

    async def stored(self, topic: str) -> TopicReplication | None:
        kv = await self.store.get(keys.topic_replication(topic))
        return TopicReplication.parse(kv.value) if kv is not None else None


@pytest.fixture
async def member(tmp_path: Path) -> AsyncIterator[Member]:
    store = EmbeddedStore.in_memory()
    # The broker's default: 3 copies, min in-sync 0 (a majority).
    broker, node = await start_member(
        store, tmp_path / "b0", "127.0.0.1:7200", "127.0.0.1:7300", **{"cluster.replication_factor": 3}
    )
    try:
        yield Member(broker, node)
    finally:
        await broker.close()
        await close_cluster(node, broker)
        await store.close()


async def test_created_with_a_setting_the_topic_stores_it_and_loads_with_it(member: Member) -> None:
    await member.ops.create_topic("/default/t", reliable=True, replication=S(2, 1))
    assert await member.stored("/default/t") == TopicReplication(replication_factor=2, min_insync_replicas=1)
    # One live broker: one copy placed now, the rest when brokers join.
    assert await member.replication_of("/default/t") == (2, 1, 1)
    await member.ops.create_topic("/default/plain", reliable=True)
    assert await member.stored("/default/plain") is None
    assert await member.replication_of("/default/plain") == (3, 1, 2)  # the broker's


async def test_every_partition_gets_the_setting(member: Member) -> None:
    created = await member.ops.create_topic("/default/p", reliable=True, partitions=3, replication=S(4, None))
    for topic in created:
        assert await member.stored(topic) == TopicReplication(replication_factor=4)
        assert await member.replication_of(topic) == (4, 1, 3)


async def test_an_invalid_setting_creates_nothing(member: Member) -> None:
    cases = [
        (S(6, None), "replication_factor must be in 1..5"),
        (S(0, None), "replication_factor must be in 1..5"),
        (S(2, 3), "min_insync_replicas must be in 1..2"),
        (S(None, 4), r"min_insync_replicas must be in 1..3 \(the replication factor that applies\)"),
    ]
    for setting, message in cases:
        with pytest.raises(InvalidArgument, match=message):
            await member.ops.create_topic("/default/bad", reliable=True, partitions=2, replication=setting)
    with pytest.raises(InvalidArgument, match="apply to Reliable topics only"):
        await member.ops.create_topic("/default/bad", reliable=False, replication=S(1, None))
    assert await member.ops.namespace_topics("default") == []
    assert await member.store.list("/topics/default/") == []


async def test_deleting_the_topic_deletes_its_setting(member: Member) -> None:
    await member.ops.create_topic("/default/d", reliable=True, replication=S(3, 3))
    await member.ops.create_topic("/default/d2", reliable=True, replication=S(2, 2))
    assert await member.stored("/default/d") is not None
    await member.ops.delete_topic("/default/d")
    assert await member.stored("/default/d") is None
    assert await member.stored("/default/d2") is not None  # the neighbour with a longer name is kept
    # Re-created without a setting, it inherits again.
    await member.ops.create_topic("/default/d", reliable=True)
    assert await member.replication_of("/default/d") == (3, 1, 2)


async def test_namespace_replication_is_set_by_compare_and_set_keeping_other_policies(member: Member) -> None:
    ops = member.ops
    await ops.create_namespace("ns")
    before = await ops.namespace_policies("ns")
    await member.store.put(keys.namespace_policy("ns"), {**before, "another_tools_field": "kept"})
    policy = await ops.set_namespace_replication("ns", S(5, None))
    assert (policy.replication_factor, policy.min_insync_replicas) == (5, None)
    policy = await ops.set_namespace_replication("ns", S(None, 4))  # checked against the stored 5
    assert (policy.replication_factor, policy.min_insync_replicas) == (5, 4)
    shown = await ops.namespace_policies("ns")
    replication = {"replication_factor": 5, "min_insync_replicas": 4}
    assert shown == {**before, "another_tools_field": "kept", **replication}
    await ops.create_topic("/ns/t", reliable=True)
    assert await member.replication_of("/ns/t") == (5, 1, 4)
    # The topic's own setting wins, field by field.
    await ops.create_topic("/ns/own", reliable=True, replication=S(None, 2))
    assert await member.replication_of("/ns/own") == (5, 1, 2)


async def test_namespace_replication_refuses_invalid_settings_and_writes_nothing(member: Member) -> None:
    ops = member.ops
    await ops.create_namespace("ns")
    await ops.set_namespace_replication("ns", S(3, 3))
    before = await member.store.get(keys.namespace_policy("ns"))
    cases = [
        (NONE, "nothing to set"),
        (S(0, None), "replication_factor must be in 1..5"),
        (S(9, 1), "replication_factor must be in 1..5"),
        (S(2, 3), "min_insync_replicas must be in 1..2"),
        (S(None, 4), r"min_insync_replicas must be in 1..3"),
        # Lowering the factor below the stored minimum without giving a new minimum.
        (S(2, None), "has min_insync_replicas 3, more than replication_factor 2; give min_insync_replicas"),
    ]
    for setting, message in cases:
        with pytest.raises(InvalidArgument, match=message):
            await ops.set_namespace_replication("ns", setting)
    after = await member.store.get(keys.namespace_policy("ns"))
    assert after is not None and before is not None and after.version == before.version
    with pytest.raises(NotFound, match="namespace 'nope' does not exist"):
        await ops.set_namespace_replication("nope", S(3, None))
    with pytest.raises(InvalidArgument):
        await ops.set_namespace_replication("bad/ns", S(3, None))
    # Both at once is fine.
    policy = await ops.set_namespace_replication("ns", S(2, 1))
    assert (policy.replication_factor, policy.min_insync_replicas) == (2, 1)


async def test_min_only_is_checked_against_the_inherited_factor(member: Member) -> None:
    ops = member.ops
    await ops.create_namespace("ns1")
    await ops.set_namespace_replication("ns1", S(1, None))
    with pytest.raises(InvalidArgument, match=r"min_insync_replicas must be in 1..1 \("):
        await ops.create_topic("/ns1/t", reliable=True, replication=S(None, 2))
    await ops.create_topic("/default/t", reliable=True, replication=S(None, 3))  # the broker's 3
    assert await member.replication_of("/default/t") == (3, 1, 3)
