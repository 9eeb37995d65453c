from __future__ import annotations

from ister.core.dispatch import (
    Delivery,
    EntryState,
    FailurePolicy,
    ReliableSubscriptionState,
    SubType,
)

FAST = FailurePolicy(
    max_redelivery_count=3,
    ack_timeout_ms=1_000,
    base_redelivery_delay_ms=100,
    max_redelivery_delay_ms=1_000,
    backoff="Fixed",
)


def make(sub_type: SubType, window: int = 10, policy: FailurePolicy = FAST) -> ReliableSubscriptionState:
    return ReliableSubscriptionState(sub_type, start_offset=0, window=window, policy=policy)


def feed(s: ReliableSubscriptionState, n: int, now: int = 0, key: str = "") -> None:
    for _ in range(n):
        s.offer(s.next_offset, key, now)


def offsets(ds: list[Delivery]) -> list[int]:
    return [d.offset for d in ds]


def test_nothing_delivered_without_consumers() -> None:
    for sub_type in SubType:
        s = make(sub_type)
        for i in range(3):
            s.offer(i, f"k{i}", 0)
        assert s.poll(0) == []
        assert s.next_wakeup() is None
        s.attach(1, (), 5)
        assert offsets(s.poll(5)) == [0, 1, 2]


def test_exclusive_delivers_in_order_and_stamps_attempts() -> None:
    s = make(SubType.EXCLUSIVE)
    s.attach(1, (), 0)
    feed(s, 3)
    ds = s.poll(0)
    assert ds == [Delivery(1, 0, 1, False), Delivery(1, 1, 1, False), Delivery(1, 2, 1, False)]
    assert s.poll(0) == []
    assert s.active_consumer() == 1
    assert s.in_flight() == {0: 1, 1: 1, 2: 1}


def test_exclusive_redelivery_after_detach_and_reattach_unacked_first() -> None:
    s = make(SubType.EXCLUSIVE)
    s.attach(1, (), 0)
    feed(s, 4)
    s.poll(0)
    for off in (0, 1, 2):
        s.on_ack(off, 10)
    assert s.detach(1, 20) == 1
    assert s.state_of(3) is EntryState.RETRY
    feed(s, 3, now=25)
    assert s.poll(30) == []
    s.attach(1, (), 40)
    ds = s.poll(40)
    assert ds[0] == Delivery(1, 3, 2, True)
    assert offsets(ds) == [3, 4, 5, 6]
    # a detach is not a failure: no backoff, no exhaustion progress
    assert s.stats().nacked_total == 0 and s.stats().ack_timeouts_total == 0


def test_repeated_reconnects_redeliver_pending_first_each_time() -> None:
    s = make(SubType.EXCLUSIVE, policy=FailurePolicy(max_redelivery_count=0))
    s.attach(1, (), 0)
    feed(s, 3)
    s.poll(0)
    s.on_ack(0, 1)
    for t in (10, 20):
        s.detach(1, t)
        s.attach(1, (), t)
        assert offsets(s.poll(t))[:2] == [1, 2]
    assert s.on_ack(1, 30) and s.cursor == 1
    assert s.take_dead_letters() == []  # reconnects never exhaust a message


def test_reattach_while_attached_resends_in_flight() -> None:
    s = make(SubType.EXCLUSIVE)
    s.attach(1, (), 0)
    feed(s, 2)
    s.poll(0)
    s.attach(1, (), 5)
    assert [(d.offset, d.attempt, d.redelivery) for d in s.poll(5)] == [(0, 2, True), (1, 2, True)]


def test_failover_promotes_standby_and_redelivers_to_it() -> None:
    s = make(SubType.FAILOVER)
    s.attach(1, (), 0)
    s.attach(2, (), 0)
    feed(s, 3)
    assert {d.consumer_id for d in s.poll(0)} == {1}
    s.on_ack(0, 1)
    s.detach(1, 5)
    assert s.active_consumer() == 2
    ds = s.poll(5)
    assert [(d.consumer_id, d.offset, d.redelivery) for d in ds] == [(2, 1, True), (2, 2, True)]
    s.attach(1, (), 6)
    assert s.active_consumer() == 2
    feed(s, 1, now=6)
    assert [d.consumer_id for d in s.poll(6)] == [2]
    assert set(s.in_flight().values()) == {2}


def test_shared_round_robin_and_other_consumer_gets_redelivery() -> None:
    s = make(SubType.SHARED, window=100)
    for cid in (1, 2, 3):
        s.attach(cid, (), 0)
    feed(s, 36)
    ds = s.poll(0)
    counts = {cid: sum(d.consumer_id == cid for d in ds) for cid in (1, 2, 3)}
    assert counts == {1: 12, 2: 12, 3: 12}
    assert [d.consumer_id for d in ds[:4]] == [1, 2, 3, 1]
    held_by_2 = sorted(o for o, c in s.in_flight().items() if c == 2)
    assert s.detach(2, 10) == 12
    again = s.poll(10)
    assert offsets(again) == held_by_2
    assert {d.consumer_id for d in again} == {1, 3}
    assert all(d.redelivery and d.attempt == 2 for d in again)


def test_nack_redelivers_after_policy_delay() -> None:
    s = make(SubType.EXCLUSIVE)
    s.attach(1, (), 0)
    feed(s, 2)
    s.poll(0)
    assert s.on_nack(0, 50, None, "bad")
    assert not s.on_nack(0, 51, None, "late nack")
    assert s.next_wakeup() == 150
    assert s.poll(149) == []
    assert s.poll(150) == [Delivery(1, 0, 2, True)]
    # a client delay can only lengthen it
    assert s.on_nack(1, 200, 700, None)
    assert s.next_wakeup() == 900
    assert s.poll(899) == []
    assert offsets(s.poll(900)) == [1]


def test_exponential_backoff_between_nacks() -> None:
    policy = FailurePolicy(max_redelivery_count=5, base_redelivery_delay_ms=100, max_redelivery_delay_ms=350)
    s = make(SubType.EXCLUSIVE, policy=policy)
    s.attach(1, (), 0)
    feed(s, 1)
    now = 0
    s.poll(now)
    waits = []
    for _ in range(4):
        s.on_nack(0, now, None, None)
        wake = s.next_wakeup()
        assert wake is not None
        waits.append(wake - now)
        now = wake
        assert offsets(s.poll(now)) == [0]
    assert waits == [100, 200, 350, 350]


def test_ack_timeout_counts_as_failure_and_redelivers() -> None:
    s = make(SubType.EXCLUSIVE)
    s.attach(1, (), 0)
    feed(s, 1)
    s.poll(0)
    assert s.next_wakeup() == 1_000
    assert s.tick(999) == 0
    assert s.tick(1_000) == 1
    assert s.state_of(0) is EntryState.RETRY
    assert s.next_wakeup() == 1_100
    assert s.poll(1_100) == [Delivery(1, 0, 2, True)]
    assert s.stats().ack_timeouts_total == 1


def test_poll_applies_timeouts_itself() -> None:
    s = make(SubType.EXCLUSIVE, policy=FailurePolicy(ack_timeout_ms=10, base_redelivery_delay_ms=0))
    s.attach(1, (), 0)
    feed(s, 1)
    s.poll(0)
    assert s.poll(10) == [Delivery(1, 0, 2, True)]


def test_late_ack_after_timeout_is_accepted() -> None:
    s = make(SubType.EXCLUSIVE)
    s.attach(1, (), 0)
    feed(s, 1)
    s.poll(0)
    s.tick(1_000)
    assert s.state_of(0) is EntryState.RETRY
    assert s.on_ack(0, 1_050)
    assert s.cursor == 0 and s.poll(5_000) == [] and s.next_wakeup() is None


def test_unknown_or_undelivered_ack_is_ignored() -> None:
    s = make(SubType.EXCLUSIVE)
    feed(s, 2)
    assert not s.on_ack(0, 0)  # offered, never delivered
    assert not s.on_ack(99, 0)  # never offered
    assert not s.on_nack(0, 0, None, None)
    s.attach(1, (), 0)
    s.poll(0)
    assert s.on_ack(0, 1)
    assert not s.on_ack(0, 2)  # already acked
    assert s.cursor == 0 and s.stats().acked_total == 1


def test_retries_come_before_new_messages() -> None:
    s = make(SubType.EXCLUSIVE, policy=FailurePolicy(base_redelivery_delay_ms=0))
    s.attach(1, (), 0)
    feed(s, 2)
    s.poll(0)
    s.on_nack(1, 1, None, None)
    s.on_nack(0, 1, None, None)
    feed(s, 2, now=1)
    assert offsets(s.poll(1)) == [0, 1, 2, 3]


def test_remove_requeues_and_frees_exclusive_slot() -> None:
    s = make(SubType.EXCLUSIVE)
    s.attach(1, (), 0)
    feed(s, 1)
    s.poll(0)
    assert s.remove(1, 5) == 1
    s.attach(2, (), 6)
    assert s.poll(6) == [Delivery(2, 0, 2, True)]
