"""The history checker (core/history.py) on hand-built histories: one clean history, then one anomaly of
each kind, each test failing when the checker misses it."""

from __future__ import annotations

from ister.core.dispatch.types import SubType
from ister.core.history import (
    Acked,
    ConsumerAck,
    CursorObserved,
    CursorReset,
    Delivery,
    History,
    Publish,
    Subscription,
    check,
)

T = "/default/h"


def clean(sub_type: SubType = SubType.EXCLUSIVE) -> History:
    """Three messages on two keys, acknowledged at 0..2, stored, delivered once and acked by `sub`."""
    h = History()
    h.subscriptions.append(Subscription(T, "sub", sub_type))
    for i, key in enumerate(["a", "b", "a"]):
        payload = f"m{i}".encode()
        h.publishes.append(Publish(T, payload, key, i))
        h.acks.append(Acked(T, payload, i, i + 0.5))
        h.deliveries.append(Delivery(T, "sub", "c1", i, payload, f"id{i}", i + 0.6))
        h.consumer_acks.append(ConsumerAck(T, "sub", "c1", i, i + 0.7))
        h.cursors.append(CursorObserved(T, "sub", i + 1, i + 0.9))
    h.reads[T] = {i: f"m{i}".encode() for i in range(3)}
    return h


def test_a_clean_history_is_ok() -> None:
    for sub_type in SubType:
        result = check(clean(sub_type))
        assert result.ok, result.summary()
        assert result.acknowledged == 3
        assert result.undelivered == {f"{T} sub": 0}
        assert result.lost == result.conflicts == result.duplicate_deliveries == 0


def test_lost_acknowledged_message() -> None:
    h = clean()
    del h.reads[T][1]
    result = check(h)
    assert result.lost == 1 and not result.ok
    assert "m1" in result.examples["lost"][0]


def test_acknowledged_beyond_the_read_back_is_lost() -> None:
    h = clean()
    h.publishes.append(Publish(T, b"m3", None, 4))
    h.acks.append(Acked(T, b"m3", 3, 4.5))
    assert check(h).lost == 1


def test_conflict_between_ack_and_read_back() -> None:
    h = clean()
    h.reads[T][1] = b"other"
    result = check(h)
    assert result.conflicts == 1 and not result.ok
    assert result.lost == 0  # the offset is there, bound to another payload


def test_conflict_seen_only_by_a_consumer() -> None:
    """A delivery of a payload that was later truncated from the offset is a conflict too."""
    h = clean()
    h.deliveries.append(Delivery(T, "sub", "c1", 2, b"phantom", "idx", 2.8))
    assert check(h).conflicts == 1


def test_two_acknowledgements_at_two_offsets_are_a_conflict_free_duplicate() -> None:
    h = clean()
    h.acks.append(Acked(T, b"m2", 3, 3.0))
    h.reads[T][3] = b"m2"
    h.deliveries.append(Delivery(T, "sub", "c1", 3, b"m2", "id3", 3.1))
    h.consumer_acks.append(ConsumerAck(T, "sub", "c1", 3, 3.2))
    result = check(h)
    assert result.duplicates_stored == 1 and result.conflicts == 0
    assert result.ok  # allowed by at-least-once publishing


def test_payload_stored_twice_by_a_retry() -> None:
    h = clean()
    h.reads[T][3] = b"m0"  # the retry of an unanswered publish stored it again
    result = check(h)
    assert result.duplicates_stored == 1


def test_duplicate_delivery() -> None:
    h = clean()
    h.deliveries.append(Delivery(T, "sub", "c1", 1, b"m1", "id1", 3.0))
    result = check(h)
    assert result.duplicate_deliveries == 1 and result.ok


def test_undelivered_on_a_live_subscription() -> None:
    h = clean()
    h.subscriptions.append(Subscription(T, "other", SubType.SHARED))
    h.deliveries.append(Delivery(T, "other", "c2", 0, b"m0", "x", 1.0))
    h.deliveries.append(Delivery(T, "other", "c2", 2, b"m2", "y", 3.0))
    result = check(h)
    assert result.undelivered[f"{T} other"] == 1 and not result.ok
    assert "offset 1" in result.examples["undelivered"][0]


def test_undelivered_not_owed_before_first_offset_nor_by_a_dead_subscription() -> None:
    h = clean()
    h.subscriptions.append(Subscription(T, "late", SubType.SHARED, first_offset=2))
    h.deliveries.append(Delivery(T, "late", "c2", 2, b"m2", "y", 3.0))
    h.subscriptions.append(Subscription(T, "gone", SubType.SHARED, live=False))
    result = check(h)
    assert result.ok, result.summary()


def test_retention_skip_is_counted_not_lost() -> None:
    h = clean()
    h.subscriptions.append(Subscription(T, "slow", SubType.SHARED))
    h.deliveries.append(Delivery(T, "slow", "c2", 2, b"m2", "y", 3.0))
    h.start_offsets[T] = 2
    del h.reads[T][0]
    del h.reads[T][1]
    result = check(h)
    assert result.lost == 0 and result.skipped_by_retention == 2 and result.ok


def _swap_first_deliveries(h: History) -> None:
    h.deliveries[0], h.deliveries[2] = h.deliveries[2], h.deliveries[0]


def test_order_violation_exclusive_and_failover() -> None:
    for sub_type in (SubType.EXCLUSIVE, SubType.FAILOVER):
        h = clean(sub_type)
        _swap_first_deliveries(h)  # 2 before 0
        result = check(h)
        assert result.order_violations == 2 and not result.ok  # 1 and 0 after 2
        assert "out of order" in result.examples


def test_order_violation_key_shared_per_key() -> None:
    h = clean(SubType.KEY_SHARED)
    h.deliveries[1], h.deliveries[2] = h.deliveries[2], h.deliveries[1]  # keys a,a,b: still ordered per key
    assert check(h).order_violations == 0
    _swap_first_deliveries(h)  # now 1 (b), 2 (a), 0 (a): key a out of order
    result = check(h)
    assert result.order_violations == 1
    assert "key 'a'" in result.examples["out of order"][0]


def test_shared_promises_no_order() -> None:
    h = clean(SubType.SHARED)
    _swap_first_deliveries(h)
    assert check(h).order_violations == 0


def test_a_redelivery_is_not_an_order_violation() -> None:
    h = clean()
    h.deliveries.append(Delivery(T, "sub", "c1", 0, b"m0", "id0", 3.0))
    assert check(h).order_violations == 0


def test_cursor_regression() -> None:
    h = clean()
    h.cursors.append(CursorObserved(T, "sub", 1, 4.0))
    result = check(h)
    assert result.cursor_regressions == 1 and not result.ok


def test_cursor_may_go_back_on_an_explicit_reset() -> None:
    h = clean()
    h.cursors.append(CursorReset(T, "sub", 0, 4.0))
    h.cursors.append(CursorObserved(T, "sub", 1, 4.5))
    assert check(h).cursor_regressions == 0


def test_cursor_ahead_of_consumer_acks() -> None:
    h = clean()
    h.consumer_acks = [a for a in h.consumer_acks if a.offset != 1]
    result = check(h)
    assert result.cursor_ahead == 1 and not result.ok
    assert "offset 1 never acknowledged" in result.examples["cursor ahead"][0]


def test_cursor_ahead_of_an_ack_made_later() -> None:
    h = clean()
    h.cursors.insert(0, CursorObserved(T, "sub", 2, 0.8))  # offset 1 is acked at 1.7
    assert check(h).cursor_ahead == 1


def test_summary_names_the_anomalies() -> None:
    h = clean()
    del h.reads[T][1]
    text = check(h).summary()
    assert text.startswith("ANOMALIES") and "1 lost" in text and "lost:" in text
