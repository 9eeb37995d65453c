"""Gaps in the log: `skip` in every subscription type and state, and the `split_runs` helper."""

from __future__ import annotations

import pytest

from ister.core.dispatch import (
    Delivery,
    EntryState,
    FailurePolicy,
    ReliableSubscriptionState,
    SubType,
    split_runs,
)

FAST = FailurePolicy(
    max_redelivery_count=3,
    ack_timeout_ms=1_000,
    base_redelivery_delay_ms=100,
    max_redelivery_delay_ms=1_000,
    backoff="Fixed",
)
BLOCK = FailurePolicy(
    max_redelivery_count=0,
    ack_timeout_ms=1_000,
    base_redelivery_delay_ms=0,
    max_redelivery_delay_ms=0,
    backoff="Fixed",
    poison_policy="Block",
)
DEAD_LETTER = FailurePolicy(
    max_redelivery_count=0,
    ack_timeout_ms=1_000,
    base_redelivery_delay_ms=0,
    max_redelivery_delay_ms=0,
    backoff="Fixed",
    poison_policy="DeadLetter",
)
HUGE = 10**12

ALL = pytest.mark.parametrize("sub_type", list(SubType), ids=lambda t: t.name)


def make(
    sub_type: SubType,
    window: int = 10,
    policy: FailurePolicy = FAST,
    start: int = 0,
    track: bool = False,
) -> ReliableSubscriptionState:
    return ReliableSubscriptionState(
        sub_type, start_offset=start, window=window, policy=policy, track_resolved=track
    )


def feed(s: ReliableSubscriptionState, n: int, key: str | None = None) -> list[int]:
    """Offer n messages; distinct keys unless `key` is given (Key-Shared sends them all at once)."""
    out = []
    for _ in range(n):
        off = s.next_offset
        s.offer(off, f"k{off}" if key is None else key, 0)
        out.append(off)
    return out


def offsets(ds: list[Delivery]) -> list[int]:
    return [d.offset for d in ds]


def ack_all(s: ReliableSubscriptionState, ds: list[Delivery], now: int = 0) -> None:
    for d in ds:
        assert s.on_ack(d.offset, now)


# -- skip: arguments and the empty window ---------------------------------------------------------------
@ALL
def test_skip_checks_its_arguments_and_changes_nothing_when_refused(sub_type: SubType) -> None:
    s = make(sub_type)
    feed(s, 2)
    with pytest.raises(ValueError, match="expected 2"):
        s.skip(3, 5, 0)
    with pytest.raises(ValueError, match="expected 2"):
        s.skip(1, 5, 0)
    with pytest.raises(ValueError, match="below first"):
        s.skip(2, 1, 0)
    assert s.next_offset == 2 and s.stats().skipped_total == 0
    assert s.skip(2, 2, 0) == 0
    assert s.next_offset == 2 and s.stats().skipped_total == 0


@ALL
def test_skip_on_an_empty_window_moves_the_cursor_at_once(sub_type: SubType) -> None:
    s = make(sub_type, start=5)
    assert s.skip(5, 9, 0) == 4
    assert s.next_offset == 9 and s.cursor == 8 and s.capacity() == 10
    assert s.stats().skipped_total == 4 and s.stats().held == 0
    assert 6 not in s.held_offsets() and s.state_of(6) is None
    s.attach(1, (), 0)
    assert s.poll(0) == []
    feed(s, 1)
    assert offsets(s.poll(0)) == [9]
    assert s.on_ack(9, 0) and s.cursor == 9


@ALL
def test_offers_stay_strict_late_fills_are_refused(sub_type: SubType) -> None:
    s = make(sub_type)
    feed(s, 1)
    s.skip(1, 4, 0)
    for late in (1, 2, 3):
        with pytest.raises(ValueError, match="expected 4"):
            s.offer(late, "k", 0)
        with pytest.raises(ValueError, match="expected 4"):
            s.offer_batch(late, ["k"], 0)
    with pytest.raises(ValueError, match="expected 4"):
        s.offer(5, "k", 0)  # above next_offset: the caller must skip first
    s.offer(4, "k", 0)
    assert sorted(s.held_offsets()) == [0, 4]


@ALL
def test_skip_takes_no_capacity_even_with_a_full_window(sub_type: SubType) -> None:
    s = make(sub_type, window=2)
    feed(s, 2)
    assert s.capacity() == 0
    assert s.skip(2, 100, 0) == 98
    assert s.capacity() == 0 and len(s.held_offsets()) == 2
    with pytest.raises(ValueError, match="window full"):
        s.offer(100, "k", 0)
    s.attach(1, (), 0)
    ack_all(s, s.poll(0))
    assert s.cursor == 99 and s.capacity() == 2


@ALL
def test_a_huge_gap_costs_nothing(sub_type: SubType) -> None:
    s = make(sub_type)
    assert s.skip(0, HUGE, 0) == HUGE
    assert s.cursor == HUGE - 1
    feed(s, 1)
    assert s.skip(HUGE + 1, 2 * HUGE, 0) == HUGE - 1  # a gap behind a pending message
    feed(s, 1)
    assert sorted(s.held_offsets()) == [HUGE, 2 * HUGE]
    assert s.lag(2 * HUGE + 1) == HUGE + 1
    s.attach(1, (), 0)
    ds = s.poll(0)
    assert offsets(ds) == [HUGE, 2 * HUGE]
    assert s.ack_range(0, 3 * HUGE, 0) == 2
    assert s.cursor == 2 * HUGE and s.stats().skipped_total == 2 * HUGE - 1


# -- skip with never-sent messages pending --------------------------------------------------------------
@ALL
def test_pending_run_is_split_around_skipped_ranges(sub_type: SubType) -> None:
    s = make(sub_type)
    feed(s, 3)
    assert s.skip(3, 7, 0) == 4
    feed(s, 2)
    s.skip(9, 10, 0)
    s.skip(10, 12, 0)  # right after another skip
    feed(s, 1)
    assert sorted(s.held_offsets()) == [0, 1, 2, 7, 8, 12]
    assert len(s.held_offsets()) == 6 and s.capacity() == 4
    for gap in (3, 6, 9, 10, 11):
        assert gap not in s.held_offsets() and s.state_of(gap) is None
    assert s.state_of(7) is EntryState.PENDING
    assert s.stats().pending == 6 and s.stats().skipped_total == 7
    s.attach(1, (), 0)
    ds = s.poll(0)
    assert offsets(ds) == [0, 1, 2, 7, 8, 12]
    assert all(d.consumer_id == 1 and d.attempt == 1 for d in ds)
    assert s.in_flight() == {o: 1 for o in (0, 1, 2, 7, 8, 12)}
    assert s.stats().delivered_total == 6
    for off in (1, 2, 0):
        assert s.on_ack(off, 0)
    assert s.cursor == 6  # passed [3, 7) as soon as 0..2 were acked; 7 is open
    assert s.on_ack(8, 0) and s.cursor == 6
    assert s.on_ack(7, 0) and s.cursor == 11
    assert s.on_ack(12, 0) and s.cursor == 12
    assert not s.held_offsets()


def test_shared_round_robin_continues_across_a_gap() -> None:
    s = make(SubType.SHARED)
    s.attach(1, (), 0)
    s.attach(2, (), 0)
    feed(s, 3)
    s.skip(3, 7, 0)
    feed(s, 2)
    s.skip(9, 12, 0)
    feed(s, 1)
    ds = s.poll(0)
    assert [(d.consumer_id, d.offset) for d in ds] == [(1, 0), (2, 1), (1, 2), (2, 7), (1, 8), (2, 12)]
    assert s.in_flight() == {0: 1, 1: 2, 2: 1, 7: 2, 8: 1, 12: 2}
    feed(s, 1)
    assert [(d.consumer_id, d.offset) for d in s.poll(0)] == [(1, 13)]
    assert s.ack_upto(12, 2, 0) == 3  # 1, 7, 12
    assert s.ack_upto(13, 1, 0) == 4
    assert s.cursor == 13


@pytest.mark.parametrize("sub_type", [SubType.EXCLUSIVE, SubType.FAILOVER, SubType.SHARED], ids=str)
def test_cumulative_and_range_acks_over_a_split_run(sub_type: SubType) -> None:
    s = make(sub_type)
    s.attach(1, (), 0)
    feed(s, 2)
    s.skip(2, 5, 0)
    feed(s, 2)
    ds = s.poll(0)
    assert offsets(ds) == [0, 1, 5, 6]
    assert s.ack_upto(5, 1, 0) == 3
    assert s.cursor == 5
    assert s.ack_range(0, 100, 0) == 1
    assert s.cursor == 6


@ALL
def test_nack_range_over_a_gap_redelivers_only_records(sub_type: SubType) -> None:
    s = make(sub_type)
    s.attach(1, (), 0)
    feed(s, 2)
    s.skip(2, 5, 0)
    feed(s, 1)
    s.poll(0)
    assert s.nack_range(0, 10, 0, 0, "bad") == 3
    ds = s.poll(100)
    assert offsets(ds) == [0, 1, 5] and all(d.redelivery for d in ds)
    ack_all(s, ds, 100)
    assert s.cursor == 5


def test_key_shared_gap_between_messages_of_one_key() -> None:
    s = make(SubType.KEY_SHARED)
    s.attach(1, (), 0)
    s.offer(0, "a", 0)
    s.skip(1, 4, 0)
    s.offer(4, "a", 0)
    s.offer(5, "b", 0)
    assert offsets(s.poll(0)) == [0, 4, 5]
    assert s.on_ack(5, 0) and s.cursor is None
    assert s.on_ack(0, 0) and s.cursor == 3
    assert s.on_ack(4, 0) and s.cursor == 5


# -- skip while deliveries are out ----------------------------------------------------------------------
@ALL
def test_skip_while_in_flight_waits_for_the_messages_below(sub_type: SubType) -> None:
    s = make(sub_type)
    s.attach(1, (), 0)
    feed(s, 3)
    assert offsets(s.poll(0)) == [0, 1, 2]
    s.skip(3, 10, 0)
    assert s.cursor is None and s.in_flight_count == 3
    assert s.on_ack(1, 0) and s.on_ack(2, 0)
    assert s.cursor is None  # 0 is still unresolved: the gap is not passed
    feed(s, 1)
    assert offsets(s.poll(0)) == [10]
    assert s.on_ack(0, 0) and s.cursor == 9
    assert s.on_ack(10, 0) and s.cursor == 10


@ALL
def test_skip_while_a_retry_is_pending(sub_type: SubType) -> None:
    s = make(sub_type)
    s.attach(1, (), 0)
    feed(s, 2)
    s.poll(0)
    assert s.on_nack(0, 0)
    assert s.on_ack(1, 0)
    s.skip(2, 6, 0)
    feed(s, 1)
    assert s.state_of(0) is EntryState.RETRY
    ds = s.poll(0)
    assert offsets(ds) == [6]
    ds = s.poll(100)
    assert ds == [Delivery(1, 0, 2, True)]
    assert s.cursor is None
    assert s.on_ack(0, 100) and s.cursor == 5
    assert s.on_ack(6, 100) and s.cursor == 6


@ALL
def test_skip_across_a_timeout_and_a_consumer_change(sub_type: SubType) -> None:
    s = make(sub_type)
    s.attach(1, (), 0)
    feed(s, 2)
    s.poll(0)
    s.skip(2, 4, 0)
    feed(s, 1)
    if sub_type is not SubType.EXCLUSIVE:
        s.attach(2, (), 0)
    assert s.detach(1, 10) >= 2
    if sub_type is SubType.EXCLUSIVE:
        s.attach(1, (), 10)
    ds = s.poll(10)
    assert sorted(offsets(ds)) == [0, 1, 4]
    assert s.tick(2_000) == 3
    ds = s.poll(2_100)
    assert sorted(offsets(ds)) == [0, 1, 4] and all(d.attempt == 3 for d in ds if d.offset < 2)
    ack_all(s, ds, 2_100)
    assert s.cursor == 4 and not s.held_offsets()


@pytest.mark.parametrize("sub_type", [SubType.EXCLUSIVE, SubType.FAILOVER, SubType.SHARED], ids=str)
def test_skip_while_blocked_then_unblocked(sub_type: SubType) -> None:
    s = make(sub_type, policy=BLOCK)
    s.attach(1, (), 0)
    feed(s, 1)
    s.poll(0)
    assert s.on_nack(0, 0)
    assert s.state_of(0) is EntryState.EXHAUSTED and s.stats().blocked == 1
    feed(s, 2)
    s.skip(3, 5, 0)
    feed(s, 1)
    assert s.skip(6, 8, 0) == 2
    assert s.poll(0) == []  # blocked: nothing new goes out
    assert sorted(s.held_offsets()) == [0, 1, 2, 5]
    assert s.on_ack(0, 0)  # a late ack lifts the block
    assert s.cursor == 0
    ds = s.poll(0)
    assert offsets(ds) == [1, 2, 5]
    ack_all(s, ds)
    assert s.cursor == 7 and s.stats().skipped_total == 4


def test_key_shared_skip_while_a_key_is_blocked() -> None:
    s = make(SubType.KEY_SHARED, policy=BLOCK)
    s.attach(1, (), 0)
    s.offer(0, "a", 0)
    s.poll(0)
    assert s.on_nack(0, 0)
    s.offer(1, "a", 0)
    s.skip(2, 5, 0)
    s.offer(5, "b", 0)
    assert offsets(s.poll(0)) == [5]  # key a waits behind its blocked head; b goes
    assert s.on_ack(5, 0) and s.cursor is None
    assert s.on_ack(0, 0)
    assert offsets(s.poll(0)) == [1]
    assert s.on_ack(1, 0) and s.cursor == 5


@ALL
def test_skip_while_a_dead_letter_is_unpublished(sub_type: SubType) -> None:
    s = make(sub_type, policy=DEAD_LETTER, track=True)
    s.attach(1, (), 0)
    feed(s, 2)
    s.poll(0)
    assert s.on_nack(0, 0) and s.on_ack(1, 0)
    s.skip(2, 9, 0)
    assert [d.offset for d in s.take_dead_letters()] == [0]
    assert s.cursor is None
    assert s.resolve_dead_letter(0)
    assert s.cursor == 8
    assert sorted(s.take_resolved()) == [0, 1]  # skipped offsets are no payloads to free


@ALL
def test_skip_with_no_consumer_attached(sub_type: SubType) -> None:
    s = make(sub_type, start=3)
    feed(s, 1)
    s.skip(4, 6, 0)
    feed(s, 1)
    assert s.poll(0) == [] and s.cursor is None
    s.attach(7, (), 0)
    ds = s.poll(0)
    assert offsets(ds) == [3, 6]
    assert s.on_ack(3, 0) and s.cursor == 5
    assert s.on_ack(6, 0) and s.cursor == 6


# -- split_runs --------------------------------------------------------------------------------------------
def test_split_runs_dense_and_empty() -> None:
    assert split_runs(5, [5, 6, 7]) == [(5, 8, False)]
    assert split_runs(5, range(5, 1005)) == [(5, 1005, False)]
    assert split_runs(5, []) == []
    assert split_runs(5, [], end=5) == []
    assert split_runs(5, [], end=9) == [(5, 9, True)]
    assert split_runs(5, [5, 6], end=7) == [(5, 7, False)]


def test_split_runs_gaps() -> None:
    assert split_runs(5, [5, 6, 7, 10, 11]) == [(5, 8, False), (8, 10, True), (10, 12, False)]
    assert split_runs(5, [7, 8], end=12) == [(5, 7, True), (7, 9, False), (9, 12, True)]
    assert split_runs(0, [1, 3, 5]) == [
        (0, 1, True),
        (1, 2, False),
        (2, 3, True),
        (3, 4, False),
        (4, 5, True),
        (5, 6, False),
    ]
    assert split_runs(0, [0, 1, 5, 9]) == [
        (0, 2, False),
        (2, 5, True),
        (5, 6, False),
        (6, 9, True),
        (9, 10, False),
    ]


def test_split_runs_refuses_disorder() -> None:
    for expected, offs in [(5, [4]), (5, [5, 5]), (5, [6, 5]), (0, [0, 2, 1]), (0, [0, 1, 1, 3])]:
        with pytest.raises(ValueError, match="out of order"):
            split_runs(expected, offs)
    with pytest.raises(ValueError, match="read end 7 is below 8"):
        split_runs(5, [5, 7], end=7)
    with pytest.raises(ValueError, match="read end 4 is below 5"):
        split_runs(5, [], end=4)


@ALL
def test_split_runs_drive_a_subscription(sub_type: SubType) -> None:
    s = make(sub_type)
    s.attach(1, (), 0)
    read = [0, 1, 4, 5, 6, 9]
    for first, end, gap in split_runs(s.next_offset, read, end=12):
        if gap:
            s.skip(first, end, 0)
        else:
            s.offer_batch(first, [f"k{o}" for o in range(first, end)], 0)
    assert s.next_offset == 12 and s.stats().skipped_total == 6
    ds = s.poll(0)
    assert offsets(ds) == read
    ack_all(s, ds)
    assert s.cursor == 11
