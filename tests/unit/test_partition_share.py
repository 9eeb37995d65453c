"""Cluster partition groups (broker/partition_share.py): the keys, the common members, and SharedGroups
writing this broker's keys under its lease and reading everyone's through one watch."""

from __future__ import annotations

from pathlib import Path

from ister.broker.partition_share import SharedGroups
from ister.core.dispatch.partitions import common_members
from ister.metadata import keys
from ister.metadata.embedded import EmbeddedStore
from ister.metadata.store import Put
from tests.support import until


def test_keys_round_trip() -> None:
    members = keys.partition_group_members("/default/orders", "group one", 42)
    assert members == "/ister/partition-groups/default/orders/group one/members/42"
    assert keys.partition_group_from_key(members) == ("/default/orders", "group one", "members", 42)
    assignment = keys.partition_group_assignment("/default/orders", "g")
    assert keys.partition_group_from_key(assignment) == ("/default/orders", "g", "assignment", None)
    for bad in (
        "/ister/partition-groups/default/orders/g/members/x",
        "/ister/partition-groups/default/orders/g/other",
        "/ister/partition-groups/default",
        "/ister/owners/default/orders",
    ):
        assert keys.partition_group_from_key(bad) is None


def test_common_members_need_every_partition() -> None:
    view = {0: {"a", "b"}, 1: {"b", "c", "a"}, 2: {"a", "b"}}
    assert common_members(view, 3) == ["a", "b"]
    assert common_members(view, 4) == []  # partition 3 not reported: nobody is on it yet
    assert common_members({}, 0) == []


async def test_shared_groups_write_under_the_lease_and_read_every_broker(tmp_path: Path) -> None:
    store = await EmbeddedStore.open(tmp_path / "meta")
    try:
        for i in range(3):
            await store.put(keys.namespace_topic(f"/default/t-part-{i}"), 0)
        lease = await store.grant_lease(30)
        here = SharedGroups(store, 1, lambda: lease)
        here.start()
        # Another broker's report, as the watch sees it.
        other = keys.partition_group_members("/default/t", "g", 2)
        await store.txn([], [Put(other, {"2": ["a", "b"]})])
        here.publish_members("/default/t", "g", {0: ["a", "b"], 1: ["a"]})
        here.publish_assignment("/default/t", "g", {0: "a", 1: "a", 2: "b"})
        assert here.assignment("/default/t", "g") == {0: "a", 1: "a", 2: "b"}  # followed at once

        def seen() -> bool:
            view = here.members_view("/default/t", "g")
            return view == {0: frozenset("ab"), 1: frozenset("a"), 2: frozenset("ab")}

        await until(seen, "both brokers' reports through the watch")
        await until(lambda: here.partitions("/default/t") == 3, "the partition count")
        mine = await store.get(keys.partition_group_members("/default/t", "g", 1))
        assert mine is not None and mine.value == {"0": ["a", "b"], "1": ["a"]}
        # Nothing served here any more: the report goes; the lease takes everything else with it.
        here.publish_members("/default/t", "g", {})
        await until(
            lambda: here.members_view("/default/t", "g") == {2: frozenset("ab")}, "this broker's report gone"
        )
        await store.revoke_lease(lease)
        await until(lambda: here.assignment("/default/t", "g") is None, "the assignment gone with the lease")
        await here.close()
    finally:
        await store.close()
