from __future__ import annotations

import pytest

from ister.core.dispatch import CursorTracker, FailurePolicy, ReliableSubscriptionState, SubType
from ister.errors import InvalidArgument


def make(
    window: int = 10, start: int = 0, sub_type: SubType = SubType.EXCLUSIVE
) -> ReliableSubscriptionState:
    return ReliableSubscriptionState(sub_type, start_offset=start, window=window, policy=FailurePolicy())


def test_cursor_example_out_of_order_acks() -> None:
    s = make(start=1)
    s.attach(7, (), 0)
    for off in (1, 2, 3):
        s.offer(off, "", 0)
    assert [d.offset for d in s.poll(0)] == [1, 2, 3]
    assert s.cursor is None
    assert s.on_ack(3, 1) and s.cursor is None
    assert s.on_ack(1, 1) and s.cursor == 1
    assert s.on_ack(2, 1) and s.cursor == 3


def test_cursor_tracker_skips() -> None:
    c = CursorTracker(1)
    assert c.cursor is None
    c.mark(1)
    c.mark(2)
    c.mark(4)
    assert c.cursor == 2 and c.out_of_order == 1
    assert c.mark(3) and c.cursor == 4 and c.out_of_order == 0
    assert not c.mark(2) and c.cursor == 4
    assert c.is_resolved(0) and not c.is_resolved(5)
    with pytest.raises(ValueError):
        CursorTracker(-1)


def test_window_capacity_enforced() -> None:
    s = make(window=2)
    s.attach(1, (), 0)
    assert s.capacity() == 2
    s.offer(0, "", 0)
    s.offer(1, "", 0)
    assert s.capacity() == 0
    with pytest.raises(ValueError):
        s.offer(2, "", 0)
    assert len(s.poll(0)) == 2
    assert s.in_flight_count == 2
    s.on_ack(1, 0)
    assert s.capacity() == 1
    s.offer(2, "", 0)
    assert [d.offset for d in s.poll(0)] == [2]


def test_window_of_one_is_stop_and_wait() -> None:
    s = make(window=1)
    s.attach(1, (), 0)
    s.offer(0, "", 0)
    assert [d.offset for d in s.poll(0)] == [0]
    assert s.capacity() == 0 and s.poll(10) == []
    s.on_ack(0, 20)
    s.offer(1, "", 20)
    assert [d.offset for d in s.poll(20)] == [1]


def test_offer_must_be_in_order() -> None:
    s = make(start=5)
    assert s.next_offset == 5
    with pytest.raises(ValueError):
        s.offer(4, "", 0)
    with pytest.raises(ValueError):
        s.offer(6, "", 0)
    s.offer(5, "", 0)
    assert s.next_offset == 6


@pytest.mark.parametrize("window", [0, -1, 10_001, True])
def test_window_bounds(window: int) -> None:
    with pytest.raises(InvalidArgument):
        make(window=window)


def test_window_bounds_accepted() -> None:
    assert make(window=1).window == 1
    assert make(window=10_000).capacity() == 10_000
    with pytest.raises(InvalidArgument):
        make(start=-1)


def test_lag_and_held_offsets() -> None:
    s = make(start=3)
    assert s.lag(3) == 0 and s.lag(10) == 7 and s.lag(0) == 0
    s.attach(1, (), 0)
    for off in (3, 4, 5):
        s.offer(off, "", 0)
    s.poll(0)
    s.on_ack(3, 0)
    s.on_ack(5, 0)
    assert s.cursor == 3
    assert s.lag(6) == 2
    assert set(s.held_offsets()) == {4}
    stats = s.stats()
    assert (stats.held, stats.in_flight, stats.acked_total, stats.delivered_total) == (1, 1, 2, 3)
    assert stats.as_dict()["cursor"] == 3
