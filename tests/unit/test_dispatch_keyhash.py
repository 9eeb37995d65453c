from __future__ import annotations

import pytest

from ister.core.dispatch import HashRing, glob_match, key_hash
from ister.core.dispatch.keyhash import VIRTUAL_NODES, consumer_nodes, fmix32, fnv1a64


def test_fnv1a64_reference_vectors() -> None:
    assert fnv1a64(b"") == 0xCBF29CE484222325
    assert fnv1a64(b"a") == 0xAF63DC4C8601EC8C
    assert fnv1a64(b"foobar") == 0x85944171F73967E8


def test_fmix32_reference_values() -> None:
    assert fmix32(0) == 0
    assert fmix32(1) == 0x514E28B7


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", 3323002737),
        ("a", 1987926311),
        ("user-1", 3021408739),
        ("key-42", 3514502823),
        ("1-0", 1165722698),
    ],
)
def test_key_hash_known_values(value: str, expected: int) -> None:
    assert key_hash(value) == expected


def test_key_hash_is_utf8_and_32_bit() -> None:
    assert key_hash("héllo") == 560518553
    long_key = "x" * 1000
    assert key_hash(long_key) == key_hash(long_key)
    assert all(0 <= key_hash(f"k{i}") < 2**32 for i in range(200))


def test_ring_is_deterministic_and_order_independent() -> None:
    a = HashRing([1, 2, 3])
    b = HashRing([3, 1, 2])
    keys = [f"key-{i}" for i in range(500)]
    assert [a.lookup(k) for k in keys] == [b.lookup(k) for k in keys]
    assert len(a) == 3 * VIRTUAL_NODES
    assert len(consumer_nodes(7)) == VIRTUAL_NODES


def test_ring_lookup_is_first_node_at_or_after_key_hash_wrapping() -> None:
    ring = HashRing([10, 20])
    nodes = sorted([(h, 10) for h in consumer_nodes(10)] + [(h, 20) for h in consumer_nodes(20)])
    for i in range(300):
        key = f"k-{i}"
        h = key_hash(key)
        expected = next((cid for nh, cid in nodes if nh >= h), nodes[0][1])
        assert ring.lookup(key) == expected


def test_adding_a_third_consumer_remaps_a_moderate_share() -> None:
    keys = [f"key-{i}" for i in range(1000)]
    two, three = HashRing([1, 2]), HashRing([1, 2, 3])
    moved = sum(two.lookup(k) != three.lookup(k) for k in keys)
    assert 150 <= moved <= 550
    # keys that moved went to the new consumer only
    assert all(three.lookup(k) == 3 for k in keys if two.lookup(k) != three.lookup(k))
    assert {two.lookup(k) for k in keys} == {1, 2}


def test_restricted_lookup_equals_ring_of_eligible_only() -> None:
    full = HashRing([1, 2, 3, 4])
    sub = HashRing([2, 4])
    for i in range(300):
        key = f"r{i}"
        assert full.lookup(key, {2, 4}) == sub.lookup(key)
    assert HashRing([]).lookup("x") is None
    assert full.lookup("x", set()) is None


@pytest.mark.parametrize(
    ("pattern", "key", "matches"),
    [
        ("user-*", "user-1", True),
        ("user-*", "user-", True),
        ("user-*", "order-1", False),
        ("user-*", "xuser-1", False),
        ("us-?", "us-1", True),
        ("us-?", "us-12", False),
        ("us-?", "us-", False),
        ("*", "", True),
        ("*", "anything at all", True),
        ("eu-*-order", "eu-west-order", True),
        ("eu-*-order", "eu--order", True),
        ("eu-*-order", "eu-west-orders", False),
        ("*-*-*", "a-b-c", True),
        ("*-*-*", "--", True),
        ("*-*-*", "a-b", False),
        ("[ab]", "[ab]", True),
        ("[ab]", "a", False),
        ("a.b", "axb", False),
        ("a+b", "a+b", True),
        ("", "", True),
        ("", "x", False),
        ("**x", "x", True),
        ("line?", "line\n", True),
    ],
)
def test_glob(pattern: str, key: str, matches: bool) -> None:
    assert glob_match(pattern, key) is matches
