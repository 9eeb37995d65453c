"""Partition assignment and handoff planning (core/dispatch/partitions.py)."""

from __future__ import annotations

from ister.core.dispatch.partitions import Handoff, RebalanceTimer, assign, moves, plan_handoffs


def counts(assignment: dict[int, str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in assignment.values():
        out[c] = out.get(c, 0) + 1
    return out


def test_first_assignment_spreads_evenly() -> None:
    a = assign(list(range(6)), ["a", "b", "c", "d"], {})
    assert sorted(counts(a).values()) == [1, 1, 2, 2] and len(a) == 6


def test_a_join_moves_only_what_the_newcomer_needs() -> None:
    before = {p: ("a" if p < 3 else "b") for p in range(6)}
    after = assign(list(range(6)), ["a", "b", "c"], before)
    assert counts(after) == {"a": 2, "b": 2, "c": 2}
    assert len(moves(before, after)) == 2  # one from each, nothing shuffled between a and b


def test_a_departure_moves_only_its_partitions() -> None:
    before = {0: "a", 1: "a", 2: "b", 3: "b", 4: "c", 5: "c"}
    after = assign(list(range(6)), ["a", "b"], {p: c for p, c in before.items() if c != "c"})
    assert [(p, src, dst) for p, src, dst in moves(before, after)] == [(4, "c", "a"), (5, "c", "b")]


def test_the_extra_partitions_stay_with_those_who_hold_them() -> None:
    before = {0: "a", 1: "a", 2: "a", 3: "b", 4: "b"}
    after = assign(list(range(5)), ["a", "b"], before)
    assert after == before  # already balanced within one: nothing moves


def test_no_consumers_no_assignment() -> None:
    assert assign([0, 1], [], {0: "a"}) == {}


def test_handoffs_only_for_moving_partitions_and_a_replan_keeps_the_holder() -> None:
    old = {0: "a", 1: "a", 2: "b"}
    new = {0: "a", 1: "c", 2: "b"}
    planned, resume = plan_handoffs(old, new, now=10.0, max_handoff_s=5.0)
    assert list(planned) == [1] and resume == []
    h = planned[1]
    assert (h.source, h.target, h.paused_at) == ("a", "c", 10.0)
    assert not h.ready(now=12.0, unacked=2, source_alive=True)
    assert h.ready(now=12.0, unacked=0, source_alive=True)
    assert h.ready(now=12.0, unacked=2, source_alive=False)  # a crashed consumer: at once
    assert h.ready(now=15.0, unacked=2, source_alive=True)  # the handoff time ran out
    # c leaves before the switch: the next plan sends partition 1 to d, still from a, paused since 10.
    replanned, _ = plan_handoffs(new, {0: "a", 1: "d", 2: "b"}, now=13.0, max_handoff_s=5.0, pending=planned)
    assert (replanned[1].source, replanned[1].target, replanned[1].paused_at) == ("a", "d", 10.0)
    # ...or it goes back to a: no handoff, it resumes where it was.
    back, resume = plan_handoffs(new, old, now=13.0, max_handoff_s=5.0, pending=planned)
    assert back == {} and resume == [1]


def test_switch_records_how_long_the_partition_paused() -> None:
    h = Handoff(3, "a", "b", paused_at=1.0, max_handoff_s=5.0)
    h.switch(2.5)
    assert h.paused_for == 1.5


def test_rebalance_timer_waits_for_the_last_change() -> None:
    t = RebalanceTimer(delay=5.0)
    assert not t.fire(0.0)
    t.changed(0.0)
    t.changed(3.0)  # a burst of joins
    assert not t.fire(7.0)
    assert t.fire(8.0) and not t.fire(9.0)
    zero = RebalanceTimer(delay=0.0)
    zero.changed(1.0)
    assert zero.fire(1.0)


def test_a_designated_failover_consumer_receives_and_nobody_while_none() -> None:
    from ister.core.dispatch import FailurePolicy, ReliableSubscriptionState, SubType

    st = ReliableSubscriptionState(SubType.FAILOVER, start_offset=0, window=10, policy=FailurePolicy())
    st.attach(1, (), 0)
    st.attach(2, (), 0)
    st.offer_batch(0, ["k"] * 4, 0)
    st.designate(2)
    first = st.poll(0)
    assert {d.consumer_id for d in first} == {2} and st.in_flight_of(2) == len(first) > 0
    st.designate(None)  # a handoff pauses the partition: nothing new goes anywhere
    st.offer_batch(4, ["k"] * 2, 0)
    assert st.poll(1) == [] and st.in_flight_of(2) == len(first)
    assert st.requeue(2, 2) == len(first)  # the switch hands back what 2 did not acknowledge
    st.designate(1)
    again = st.poll(3)
    assert {d.consumer_id for d in again} == {1} and st.in_flight_of(2) == 0
    st.undesignate()
    assert st.active_consumer() == 1  # the earliest attached again


def test_a_retry_due_while_no_failover_consumer_is_designated_waits_for_one() -> None:
    """A designated consumer that detaches hands its messages back as retries; with nobody designated they
    wait (no crash, no busy wake-up) and go to the next designated consumer."""
    from ister.core.dispatch import FailurePolicy, ReliableSubscriptionState, SubType

    st = ReliableSubscriptionState(SubType.FAILOVER, start_offset=0, window=10, policy=FailurePolicy())
    st.attach(1, (), 0)
    st.attach(2, (), 0)
    st.designate(1)
    st.offer_batch(0, ["", ""], 0)
    assert len(st.poll(0)) == 2
    st.detach(1, 1)  # its two messages are due again at once, but 1 was the designated consumer
    assert st.poll(2) == [] and st.next_wakeup() is None  # nothing in flight, nobody to retry to
    st.designate(2)
    assert sorted(d.offset for d in st.poll(3)) == [0, 1]
