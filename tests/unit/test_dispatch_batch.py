"""The batch operations of ReliableSubscriptionState: offer_batch, ack_range, ack_upto, nack_range,
set_window and take_resolved (the Ister batch API's path), next to the per-message ones."""

from __future__ import annotations

import pytest

from ister.core.dispatch import (
    ACK_TIMEOUT_REASON,
    DeadLetter,
    Delivery,
    EntryState,
    FailurePolicy,
    ReliableSubscriptionState,
    SubType,
)
from ister.errors import InvalidArgument

FAST = FailurePolicy(
    max_redelivery_count=2,
    ack_timeout_ms=1_000,
    base_redelivery_delay_ms=100,
    max_redelivery_delay_ms=1_000,
    backoff="Fixed",
)


def make(
    sub_type: SubType = SubType.EXCLUSIVE,
    window: int = 100,
    policy: FailurePolicy = FAST,
    consumers: tuple[int, ...] = (1,),
    start: int = 0,
) -> ReliableSubscriptionState:
    s = ReliableSubscriptionState(
        sub_type, start_offset=start, window=window, policy=policy, track_resolved=True
    )
    for cid in consumers:
        s.attach(cid, (), 0)
    return s


def offsets(ds: list[Delivery]) -> list[int]:
    return [d.offset for d in ds]


def test_delivery_is_a_cheap_named_tuple() -> None:
    d = Delivery(1, 2, 3, True)
    assert d == (1, 2, 3, True) and d.consumer_id == 1 and d.offset == 2 and d.attempt == 3 and d.redelivery
    with pytest.raises(AttributeError):
        d.offset = 5  # type: ignore[misc]


# -- offer_batch ---------------------------------------------------------------------------------------------
def test_offer_batch_adds_consecutive_offsets() -> None:
    s = make(start=5, window=10)
    s.offer_batch(5, ["a", "b", "c"], 0)
    assert s.next_offset == 8 and s.capacity() == 7
    s.offer(8, "d", 0)
    s.offer_batch(9, [], 0)  # nothing to add
    assert s.next_offset == 9
    assert s.poll(0) == [Delivery(1, o, 1, False) for o in range(5, 9)]


def test_offer_batch_refuses_gaps_and_overflow_and_changes_nothing() -> None:
    s = make(window=4)
    with pytest.raises(ValueError):
        s.offer_batch(1, ["a"], 0)
    with pytest.raises(ValueError):
        s.offer_batch(0, ["a"] * 5, 0)
    assert s.next_offset == 0 and s.capacity() == 4 and s.poll(0) == []
    s.offer_batch(0, ["a"] * 4, 0)
    with pytest.raises(ValueError):
        s.offer_batch(4, ["a"], 0)
    assert s.next_offset == 4


def test_offer_batch_key_shared_keeps_key_order() -> None:
    s = make(SubType.KEY_SHARED)
    s.offer_batch(0, ["a", "b", "a", "c", "b"], 0)
    assert offsets(s.poll(0)) == [0, 1, 2, 3, 4]
    s.offer_batch(5, ["a", "c"], 1)
    assert s.ack_range(0, 6, 1) == 5  # 5 and 6 were never sent: ignored
    assert offsets(s.poll(1)) == [5, 6]
    assert s.cursor == 4


# -- ack_range -----------------------------------------------------------------------------------------------
def test_ack_range_acks_whole_batches_and_moves_the_cursor() -> None:
    for sub_type in (SubType.EXCLUSIVE, SubType.FAILOVER, SubType.SHARED):
        s = make(sub_type, consumers=(1,) if sub_type is SubType.EXCLUSIVE else (1, 2, 3))
        s.offer_batch(0, [""] * 50, 0)
        ds = s.poll(0)
        assert len(ds) == 50
        assert s.ack_range(0, 49, 1) == 50
        assert s.cursor == 49 and s.in_flight_count == 0 and s.capacity() == 100
        assert s.take_resolved() == list(range(50))
        assert s.stats().acked_total == 50


def test_ack_range_with_gaps_overlaps_and_unknown_offsets() -> None:
    s = make(window=10)
    s.offer_batch(0, [""] * 6, 0)
    s.poll(0)
    s.offer_batch(6, [""] * 2, 0)  # 6, 7 offered, never sent
    assert s.on_ack(2, 1)
    assert s.ack_range(1, 3, 1) == 2  # 2 already acked
    assert s.ack_range(2, 4, 1) == 1  # overlaps: only 4 is new
    assert s.ack_range(3, 100, 1) == 1  # 5; 6 and 7 never sent, 8.. never offered
    assert s.ack_range(-10, -1, 1) == 0
    assert s.ack_range(5, 4, 1) == 0  # empty range
    assert s.cursor is None  # 0 is still in flight
    assert set(s.held_offsets()) == {0, 6, 7}
    assert s.ack_range(0, 0, 2) == 1 and s.cursor == 5
    assert sorted(s.take_resolved()) == [0, 1, 2, 3, 4, 5]
    assert offsets(s.poll(2)) == [6, 7]


def test_ack_range_accepts_late_acks() -> None:
    policy = FailurePolicy(
        max_redelivery_count=0, ack_timeout_ms=100, base_redelivery_delay_ms=50, poison_policy="Block"
    )
    s = make(policy=policy)
    s.offer_batch(0, [""] * 3, 0)
    s.poll(0)
    assert s.on_nack(1, 10, None, "bad")
    assert s.state_of(1) is EntryState.EXHAUSTED
    assert s.tick(100) == 2  # 0 and 2 time out: exhausted too (no redeliveries allowed)
    assert s.ack_range(0, 2, 200) == 3  # late acks of exhausted messages
    assert s.cursor == 2 and s.stats().exhausted == 0


def test_ack_range_late_ack_of_waiting_retry() -> None:
    s = make()
    s.offer_batch(0, [""] * 4, 0)
    s.poll(0)
    assert s.tick(1_000) == 4
    assert all(s.state_of(o) is EntryState.RETRY for o in range(4))
    assert s.ack_range(1, 2, 1_050) == 2
    assert offsets(s.poll(1_100)) == [0, 3]  # the acked ones are not retried
    assert s.next_wakeup() == 2_100


def test_ack_range_of_a_huge_span_key_shared() -> None:
    s = make(SubType.KEY_SHARED, window=100)
    s.offer_batch(0, ["stuck"], 0)
    s.poll(0)
    for _ in range(50):  # everything but offset 0 is acked: the window spans ~5,000 offsets, holds one
        first = s.next_offset
        s.offer_batch(first, [f"k{o}" for o in range(first, first + s.capacity())], 0)
        ds = s.poll(0)
        assert s.ack_range(first, ds[-1].offset, 1) == len(ds)
    assert s.cursor is None and set(s.held_offsets()) == {0}
    last = s.next_offset - 1
    s.offer_batch(last + 1, ["stuck", "x"], 1)  # "stuck" joins offset 0 at its consumer
    assert offsets(s.poll(1)) == [last + 1, last + 2]
    # a span far wider than what is held is answered from the held records, not scanned
    assert s.ack_range(-(2**62), 2**62, 2) == 3
    assert s.cursor == last + 2 and s.poll(2) == []


def test_ack_and_nack_range_of_a_huge_span() -> None:
    s = make(window=10)
    s.offer_batch(0, [""] * 10, 0)
    s.poll(0)
    for _ in range(100):
        s.ack_range(s.next_offset - 9, s.next_offset, 0)
        s.offer_batch(s.next_offset, [""] * 9, 0)
        s.poll(0)
    assert s.cursor is None and s.in_flight_count == 10
    assert s.nack_range(-(2**62), 2**62, 1) == 10
    assert s.nack_range(-(2**62), 2**62, 1) == 0
    assert s.tick(10**6) == 0  # nothing left in flight
    assert s.ack_range(-(2**62), 2**62, 2) == 10  # late acks of the waiting retries
    assert s.cursor == s.next_offset - 1 and not s.held_offsets()


def test_ack_range_key_shared_across_keys_and_consumers() -> None:
    s = make(SubType.KEY_SHARED, consumers=(1, 2))
    s.offer_batch(0, ["a", "b", "a", "b", "c"], 0)
    first = s.poll(0)
    assert offsets(first) == [0, 1, 2, 3, 4]
    assert s.ack_range(0, 1, 1) == 2
    s.offer_batch(5, ["a", "b"], 1)
    assert offsets(s.poll(1)) == [5, 6]
    assert s.ack_range(0, 10, 2) == 5 and s.cursor == 6


# -- ack_upto ------------------------------------------------------------------------------------------------
def test_ack_upto_is_cumulative_per_consumer_in_shared() -> None:
    s = make(SubType.SHARED, consumers=(1, 2, 3))
    s.offer_batch(0, [""] * 9, 0)
    ds = s.poll(0)
    assert [d.consumer_id for d in ds] == [1, 2, 3] * 3
    assert s.ack_upto(6, 1, 1) == 3  # 0, 3, 6
    assert s.ack_upto(100, 1, 1) == 0
    assert s.cursor == 0
    assert s.ack_upto(4, 2, 1) == 2  # 1, 4 (7 is above)
    assert s.cursor == 1
    assert s.ack_upto(8, 3, 1) == 3 and s.cursor == 6
    assert s.ack_upto(8, 99, 1) == 0  # unknown consumer
    assert sorted(s.in_flight()) == [7]
    assert s.ack_upto(7, 2, 1) == 1 and s.cursor == 8


def test_ack_upto_spans_batches_and_skips_singly_acked() -> None:
    s = make(window=1_000)
    for start in range(0, 30, 10):
        s.offer_batch(start, [""] * 10, start)
        s.poll(start)
    assert s.on_ack(12, 40)
    assert s.ack_range(20, 24, 40) == 5
    assert s.ack_upto(25, 1, 41) == 12 + 7 + 1  # 0..11, 13..19, 25
    assert s.cursor == 25
    assert s.ack_upto(29, 1, 42) == 4 and s.cursor == 29


def test_ack_upto_covers_late_messages_of_that_consumer_only() -> None:
    s = make(SubType.SHARED, consumers=(1, 2))
    s.offer_batch(0, [""] * 4, 0)
    s.poll(0)  # 0, 2 -> 1; 1, 3 -> 2
    assert s.on_nack(0, 10, None, None)  # waiting retry, last sent to 1
    assert s.detach(2, 20) == 2  # 1 and 3 handed back, last sent to 2
    s.attach(2, (), 30)
    assert s.ack_upto(3, 2, 30) == 2  # the new stream of 2 acks what its old one got
    assert s.ack_upto(3, 1, 30) == 2  # 0 (late) and 2
    assert s.cursor == 3 and not s.held_offsets()


def test_ack_upto_does_not_take_redeliveries_to_someone_else() -> None:
    s = make(SubType.SHARED, consumers=(1, 2), policy=FailurePolicy(base_redelivery_delay_ms=0))
    s.offer_batch(0, [""] * 3, 0)
    s.poll(0)  # 0 -> 1, 1 -> 2, 2 -> 1
    assert s.on_nack(0, 1, None, None)
    assert [(d.consumer_id, d.offset) for d in s.poll(1)] == [(2, 0)]  # round-robin: 2's turn
    assert s.ack_upto(5, 1, 2) == 1  # only 2: 0 was last sent to consumer 2
    assert s.ack_upto(5, 2, 2) == 2 and s.cursor == 2


def test_ack_upto_after_timeout_is_a_late_ack() -> None:
    s = make()
    s.offer_batch(0, [""] * 3, 0)
    s.poll(0)
    assert s.tick(1_000) == 3
    assert s.ack_upto(1, 1, 1_001) == 2
    assert offsets(s.poll(1_100)) == [2]


# -- nack_range ----------------------------------------------------------------------------------------------
def test_nack_range_retries_then_dead_letters() -> None:
    s = make(policy=FAST)  # 2 redeliveries: 3 attempts
    s.offer_batch(0, [""] * 5, 0)
    s.poll(0)
    now = 0
    for attempt in (1, 2, 3):
        assert s.nack_range(1, 3, now, None, "bad batch") == 3
        if attempt < 3:
            now += 100
            ds = s.poll(now)
            assert [(d.offset, d.attempt) for d in ds] == [(o, attempt + 1) for o in (1, 2, 3)]
    assert [s.state_of(o) for o in (1, 2, 3)] == [EntryState.EXHAUSTED] * 3
    assert s.take_dead_letters() == [DeadLetter(o, 3, "bad batch") for o in (1, 2, 3)]
    assert s.ack_range(0, 4, now) == 5  # late acks of the exhausted ones too
    assert s.take_dead_letters() == [] and s.cursor == 4


def test_nack_range_ignores_what_is_not_in_flight_and_honours_delay() -> None:
    s = make()
    s.offer_batch(0, [""] * 4, 0)
    s.poll(0)
    s.offer_batch(4, [""], 0)  # never sent
    assert s.on_ack(1, 1)
    assert s.nack_range(0, 10, 10, 500, None) == 3  # 0, 2, 3 (1 acked, 4 unsent)
    assert s.nack_range(0, 10, 11, None, None) == 0  # late nacks are ignored
    assert offsets(s.poll(11)) == [4]
    assert s.next_wakeup() == 510
    assert offsets(s.poll(510)) == [0, 2, 3]


def test_nack_range_drop_policy_resolves_and_frees() -> None:
    s = make(policy=FailurePolicy(max_redelivery_count=0, poison_policy="Drop"))
    s.offer_batch(0, [""] * 3, 0)
    s.poll(0)
    assert s.nack_range(0, 1, 1, None, "drop") == 2
    assert s.cursor == 1 and s.stats().dropped_total == 2
    assert s.take_resolved() == [0, 1]


def test_dead_letter_through_batch_api_then_resolved_appears_in_take_resolved() -> None:
    s = make(policy=FailurePolicy(max_redelivery_count=0, ack_timeout_ms=10))
    s.offer_batch(0, [""] * 2, 0)
    s.poll(0)
    assert s.tick(10) == 2
    assert s.take_dead_letters() == [
        DeadLetter(0, 1, ACK_TIMEOUT_REASON),
        DeadLetter(1, 1, ACK_TIMEOUT_REASON),
    ]
    assert s.resolve_dead_letter(1)
    assert s.take_resolved() == [1] and s.cursor is None
    assert s.resolve_dead_letter(0)
    assert s.take_resolved() == [0] and s.cursor == 1


# -- windows -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("window", [0, -1, 10_001, True, 2.5])
def test_set_window_bounds(window: int) -> None:
    s = make(window=10)
    with pytest.raises(InvalidArgument):
        s.set_window(window)
    assert s.window == 10


def test_set_window_shrink_keeps_what_is_held() -> None:
    s = make(window=10)
    s.offer_batch(0, [""] * 8, 0)
    s.poll(0)
    s.set_window(3)
    assert s.capacity() == 0 and len(s.held_offsets()) == 8 and s.in_flight_count == 8
    with pytest.raises(ValueError):
        s.offer(8, "", 0)
    s.offer_batch(8, [], 0)  # an empty batch is still fine
    assert s.ack_range(0, 4, 1) == 5
    assert s.capacity() == 0
    assert s.on_ack(5, 1)
    assert s.capacity() == 1
    s.offer(8, "", 1)
    s.set_window(10_000)
    assert s.capacity() == 10_000 - 3


# -- resolved log and held view ------------------------------------------------------------------------------
def test_take_resolved_needs_tracking() -> None:
    s = ReliableSubscriptionState(SubType.EXCLUSIVE, start_offset=0, window=10, policy=FAST)
    with pytest.raises(RuntimeError):
        s.take_resolved()


def test_take_resolved_reports_each_resolution_once() -> None:
    s = make(SubType.SHARED, consumers=(1, 2))
    s.offer_batch(0, [""] * 6, 0)
    s.poll(0)
    assert s.take_resolved() == []
    assert s.on_ack(3, 1)
    assert s.ack_upto(4, 1, 1) == 3  # 0, 2, 4
    assert sorted(s.take_resolved()) == [0, 2, 3, 4]
    assert s.take_resolved() == []


def test_held_offsets_is_a_live_set() -> None:
    s = make(window=10)
    held = s.held_offsets()
    s.offer_batch(0, [""] * 4, 0)
    s.poll(0)
    s.offer(4, "", 0)
    assert len(held) == 5 and 4 in held and 0 in held and 5 not in held and "x" not in held
    s.ack_range(1, 2, 0)
    assert set(held) == {0, 3, 4} and len(held) == 3


# -- timers --------------------------------------------------------------------------------------------------
def test_deadlines_fire_for_the_unacked_part_of_a_batch() -> None:
    s = make(window=1_000)
    s.offer_batch(0, [""] * 100, 0)
    s.poll(0)
    s.ack_range(0, 49, 10)
    s.ack_range(60, 99, 10)
    assert s.next_wakeup() == 1_000
    assert s.poll(999) == []
    assert s.tick(1_000) == 10
    assert [s.state_of(o) for o in (50, 59)] == [EntryState.RETRY] * 2
    ds = s.poll(1_100)
    assert offsets(ds) == list(range(50, 60)) and all(d.attempt == 2 for d in ds)
    assert s.next_wakeup() == 2_100


def test_fully_acked_batches_leave_no_wakeup() -> None:
    s = make(window=1_000)
    for t in range(5):
        s.offer_batch(s.next_offset, [""] * 10, t)
        s.poll(t)
    s.ack_range(0, 49, 10)
    assert s.next_wakeup() is None and s.tick(10**9) == 0


def test_timer_garbage_stays_bounded_with_per_message_polls() -> None:
    """One batch per poll and ack: the heaps of dead batches are compacted, not kept until deadlines pass."""
    s = make(SubType.SHARED, window=10, consumers=(1, 2))
    for now in range(20_000):
        s.offer(now, "", now)
        (d,) = s.poll(now)
        assert s.on_ack(d.offset, now)
    flight = s._flight
    assert len(flight._deadlines) <= 2 * 10 + 64 + 1
    assert all(len(heap) <= 2 * 10 + 64 + 1 for heap in flight._by_consumer.values())
    assert s.cursor == 19_999 and s.next_wakeup() is None


def test_retry_and_late_queues_stay_bounded_under_churn() -> None:
    s = make(window=5, policy=FailurePolicy(max_redelivery_count=1_000, base_redelivery_delay_ms=0))
    s.offer_batch(0, [""] * 5, 0)
    for now in range(900):
        assert len(s.poll(now)) == 5
        assert s.nack_range(0, 4, now) == 5
    assert len(s._failures.retries) <= 2 * 5 + 64 + 1
    assert all(len(h) <= 2 * 5 + 64 + 1 for h in s._failures.late._heaps.values())
    assert s.ack_upto(4, 1, 5_000) == 5 and s.cursor == 4


# -- mixing with the per-message path ------------------------------------------------------------------------
def test_shared_round_robin_continues_across_batch_and_single_sends() -> None:
    s = make(SubType.SHARED, consumers=(1, 2, 3), policy=FailurePolicy(base_redelivery_delay_ms=0))
    s.offer_batch(0, [""] * 4, 0)
    assert [d.consumer_id for d in s.poll(0)] == [1, 2, 3, 1]
    s.offer(4, "", 0)
    assert [d.consumer_id for d in s.poll(0)] == [2]
    assert s.on_nack(0, 1, None, None)
    s.offer_batch(5, [""] * 2, 1)
    assert [(d.consumer_id, d.offset) for d in s.poll(1)] == [(3, 0), (1, 5), (2, 6)]


def test_detach_hands_back_batches_and_reattach_gets_them_first() -> None:
    s = make(SubType.FAILOVER, consumers=(1, 2))
    s.offer_batch(0, [""] * 6, 0)
    s.poll(0)
    s.ack_range(0, 1, 1)
    assert s.detach(1, 2) == 4
    ds = s.poll(2)
    assert [(d.consumer_id, d.offset, d.attempt) for d in ds] == [(2, o, 2) for o in range(2, 6)]
    assert s.ack_upto(5, 2, 3) == 4 and s.cursor == 5
