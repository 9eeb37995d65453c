from __future__ import annotations

from collections import Counter

import pytest

from ister.core.dispatch import ConsumerSelector, HashRing, NonReliableRouter, SubType
from ister.errors import FailedPrecondition, InvalidArgument


def test_sub_type_wire_numbers() -> None:
    assert [SubType.EXCLUSIVE, SubType.SHARED, SubType.FAILOVER, SubType.KEY_SHARED] == [0, 1, 2, 3]


def test_shared_round_robin_is_exact() -> None:
    router = NonReliableRouter(SubType.SHARED)
    for cid in (1, 2, 3):
        router.attach(cid)
    counts = Counter(router.route("k") for _ in range(36))
    assert counts == {1: 12, 2: 12, 3: 12}


def test_shared_skips_detached_and_survives_removal() -> None:
    router = NonReliableRouter(SubType.SHARED)
    for cid in (1, 2, 3):
        router.attach(cid)
    assert [router.route("") for _ in range(2)] == [1, 2]
    router.detach(3)
    assert [router.route("") for _ in range(4)] == [1, 2, 1, 2]
    router.attach(3)
    router.remove(1)
    assert [router.route("") for _ in range(4)] == [3, 2, 3, 2]  # it was 3's turn
    router.remove(2)
    router.remove(3)
    assert router.route("") is None


def test_exclusive_one_consumer() -> None:
    router = NonReliableRouter(SubType.EXCLUSIVE)
    assert router.route("k") is None
    router.attach(1)
    assert router.route("k") == 1
    with pytest.raises(FailedPrecondition):
        router.attach(2)
    router.detach(1)
    assert router.route("k") is None
    router.attach(1)  # same id comes back
    assert router.route("k") == 1
    router.detach(1)
    router.attach(2)  # a detached holder is replaced
    assert router.route("k") == 2
    assert router.attached_consumers() == [2]


def test_failover_promotes_standby_at_once() -> None:
    router = NonReliableRouter(SubType.FAILOVER)
    for cid in (1, 2, 3):
        router.attach(cid)
    assert router.active_consumer() == 1 and router.route("x") == 1
    router.detach(1)
    assert router.active_consumer() == 2
    router.attach(1)  # returning consumer becomes a standby
    assert router.active_consumer() == 2
    router.remove(2)
    assert router.active_consumer() == 3
    router.detach(3)
    assert router.active_consumer() == 1
    router.detach(1)
    assert router.active_consumer() is None
    router.attach(3)
    assert router.active_consumer() == 3


def test_failover_reattach_of_active_keeps_it_active() -> None:
    sel = ConsumerSelector(SubType.FAILOVER)
    sel.attach(1)
    sel.attach(2)
    assert sel.attach(1) is False
    assert sel.active() == 1


def test_key_shared_affinity_and_reattach_gives_same_keys() -> None:
    router = NonReliableRouter(SubType.KEY_SHARED)
    router.attach(11)
    router.attach(22)
    keys = [f"key-{i}" for i in range(200)]
    before = {k: router.route(k) for k in keys}
    assert set(before.values()) == {11, 22}
    assert before == {k: router.route(k) for k in keys}  # stable
    router.detach(22)
    assert {router.route(k) for k in keys} == {11}
    router.attach(22)
    assert before == {k: router.route(k) for k in keys}
    ring = HashRing([11, 22])
    assert all(before[k] == ring.lookup(k) for k in keys)


def test_key_shared_filters() -> None:
    router = NonReliableRouter(SubType.KEY_SHARED)
    router.attach(1, ["user-*"])
    router.attach(2, ["order-*"])
    assert all(router.route(f"user-{i}") == 1 for i in range(20))
    assert all(router.route(f"order-{i}") == 2 for i in range(20))
    assert router.route("other") is None
    router.attach(3)  # no filters: takes everything, shares matching keys through the ring
    assert router.route("other") == 3
    shared = {router.route(f"user-{i}") for i in range(100)}
    assert shared == {1, 3}
    ring = HashRing([1, 3])
    assert all(router.route(f"user-{i}") == ring.lookup(f"user-{i}") for i in range(100))


def test_key_shared_multiple_patterns() -> None:
    router = NonReliableRouter(SubType.KEY_SHARED)
    router.attach(1, ["eu-*", "ap-*"])
    router.attach(2, ["us-*", "af-*"])
    assert [router.route(k) for k in ("eu-1", "ap-1", "us-1", "af-1")] == [1, 1, 2, 2]


def test_key_filter_validation() -> None:
    sel = ConsumerSelector(SubType.KEY_SHARED)
    with pytest.raises(InvalidArgument):
        sel.attach(1, ["*"] * 1000)
    with pytest.raises(InvalidArgument):
        sel.attach(1, ["x" * 5000])


def test_version_bumps_on_changes_only() -> None:
    sel = ConsumerSelector(SubType.KEY_SHARED)
    v = sel.version
    sel.attach(1)
    assert sel.version > v
    v = sel.version
    sel.attach(1)
    sel.detach(9)
    assert sel.version == v
    sel.attach(1, ["a*"])
    assert sel.version > v
