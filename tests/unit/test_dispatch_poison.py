from __future__ import annotations

from ister.core.dispatch import (
    ACK_TIMEOUT_REASON,
    DeadLetter,
    EntryState,
    FailurePolicy,
    PoisonPolicy,
    ReliableSubscriptionState,
    SubType,
)


def policy(poison: PoisonPolicy, max_redelivery: int = 0) -> FailurePolicy:
    return FailurePolicy(
        max_redelivery_count=max_redelivery,
        ack_timeout_ms=500,
        base_redelivery_delay_ms=50,
        max_redelivery_delay_ms=50,
        backoff="Fixed",
        poison_policy=poison,
    )


def make(sub_type: SubType, p: FailurePolicy) -> ReliableSubscriptionState:
    s = ReliableSubscriptionState(sub_type, start_offset=0, window=10, policy=p)
    s.attach(1, (), 0)
    return s


def test_dead_letter_after_max_redeliveries() -> None:
    s = make(SubType.EXCLUSIVE, policy("DeadLetter", max_redelivery=2))
    s.offer(0, "", 0)
    now = 0
    attempts = []
    for _ in range(3):
        (d,) = s.poll(now)
        attempts.append(d.attempt)
        s.on_nack(0, now, None, "dead-letter it")
        now += 50
    assert attempts == [1, 2, 3]  # max_redelivery_count + 1 deliveries
    assert s.state_of(0) is EntryState.EXHAUSTED
    assert s.poll(now + 1000) == []
    assert s.take_dead_letters() == [DeadLetter(0, 3, "dead-letter it")]
    assert s.take_dead_letters() == []  # each returned once
    assert s.cursor is None  # stays in the window until published
    assert s.dead_letter_failed(0)
    assert s.take_dead_letters() == [DeadLetter(0, 3, "dead-letter it")]
    assert s.resolve_dead_letter(0)
    assert not s.resolve_dead_letter(0)
    assert s.cursor == 0 and s.stats().dead_lettered_total == 1


def test_dead_letter_by_ack_timeout_and_new_messages_continue() -> None:
    s = make(SubType.EXCLUSIVE, policy("DeadLetter"))
    s.offer(0, "", 0)
    s.poll(0)
    s.tick(500)
    assert s.take_dead_letters() == [DeadLetter(0, 1, ACK_TIMEOUT_REASON)]
    s.offer(1, "", 501)
    assert [d.offset for d in s.poll(501)] == [1]


def test_drop_resolves_immediately() -> None:
    s = make(SubType.EXCLUSIVE, policy("Drop"))
    s.offer(0, "", 0)
    s.offer(1, "", 0)
    s.poll(0)
    assert s.on_nack(0, 1, None, "drop-me")
    assert s.state_of(0) is None and s.take_dead_letters() == []
    assert s.on_ack(1, 2)
    assert s.cursor == 1 and s.stats().dropped_total == 1


def test_block_stops_new_messages_but_not_retries() -> None:
    s = ReliableSubscriptionState(SubType.SHARED, start_offset=0, window=10, policy=policy("Block", 1))
    s.attach(1, (), 0)
    s.offer(0, "", 0)
    s.offer(1, "", 0)
    s.poll(0)
    s.on_nack(0, 0, None, None)
    assert [d.offset for d in s.poll(50)] == [0]
    s.on_nack(0, 50, None, None)
    assert s.state_of(0) is EntryState.EXHAUSTED
    s.on_nack(1, 60, None, None)  # first failure of 1: it will be retried
    s.offer(2, "after-block", 60)
    assert [d.offset for d in s.poll(110)] == [1]  # retry yes, new message no
    assert s.take_dead_letters() == []
    assert s.stats().blocked == 1
    assert s.cursor is None
    # a late ack of the blocked message (it was processed after all) lifts the block
    assert s.on_ack(0, 200)
    assert [d.offset for d in s.poll(200)] == [2]


def test_block_exclusive_after_one_nack() -> None:
    s = make(SubType.EXCLUSIVE, policy("Block"))
    s.offer(0, "", 0)
    s.poll(0)
    s.on_nack(0, 1, None, None)
    s.offer(1, "", 1)
    assert s.poll(5_000) == []
    assert s.next_wakeup() is None


def test_block_key_shared_stops_only_that_key() -> None:
    s = make(SubType.KEY_SHARED, policy("Block"))
    s.offer(0, "blocked-key", 0)
    s.poll(0)
    s.on_nack(0, 1, None, None)
    s.offer(1, "blocked-key", 1)
    s.offer(2, "healthy-key", 1)
    assert [d.offset for d in s.poll(2)] == [2]
    assert s.poll(5_000) == []


def test_key_shared_dead_letter_releases_the_key_when_resolved() -> None:
    s = make(SubType.KEY_SHARED, policy("DeadLetter"))
    s.offer(0, "k", 0)
    s.offer(1, "k", 0)
    assert [d.offset for d in s.poll(0)] == [0, 1]
    s.on_nack(0, 1, None, None)
    s.offer(2, "k", 1)
    assert s.poll(2) == []  # the key's new message waits behind the exhausted one
    (dl,) = s.take_dead_letters()
    assert s.resolve_dead_letter(dl.offset)
    assert [d.offset for d in s.poll(3)] == [2]


def test_key_shared_drop_releases_the_key() -> None:
    s = make(SubType.KEY_SHARED, policy("Drop"))
    s.offer(0, "k", 0)
    s.offer(1, "k", 0)
    s.poll(0)
    s.on_nack(0, 1, None, "drop-me")
    s.offer(2, "k", 1)
    assert [d.offset for d in s.poll(2)] == [2]
    s.on_ack(1, 3)
    s.on_ack(2, 3)
    assert s.cursor == 2


# -- on_poison: a message whose record can never be sent -----------------------------------------------------
def test_poison_dead_letters_at_once_despite_redeliveries_left() -> None:
    s = make(SubType.EXCLUSIVE, policy("DeadLetter", max_redelivery=5))
    s.offer(0, "", 0)
    s.offer(1, "", 0)
    assert [d.offset for d in s.poll(0)] == [0, 1]
    assert s.on_poison(0, 1, "cannot convert")
    assert not s.on_poison(0, 2, "cannot convert")  # no longer in flight: handled once
    assert s.take_dead_letters() == [DeadLetter(0, 1, "cannot convert")]
    assert s.poll(10_000) == []  # never redelivered
    assert s.resolve_dead_letter(0)
    assert s.on_ack(1, 3)
    assert s.cursor == 1


def test_poison_drop_resolves_and_block_blocks() -> None:
    dropped = make(SubType.EXCLUSIVE, policy("Drop", max_redelivery=5))
    dropped.offer(0, "", 0)
    dropped.poll(0)
    assert dropped.on_poison(0, 1, "cannot convert")
    assert dropped.state_of(0) is None and dropped.cursor == 0
    blocked = make(SubType.EXCLUSIVE, policy("Block", max_redelivery=5))
    blocked.offer(0, "", 0)
    blocked.poll(0)
    assert blocked.on_poison(0, 1, "cannot convert")
    assert blocked.state_of(0) is EntryState.EXHAUSTED
    blocked.offer(1, "", 1)
    assert blocked.poll(10_000) == []


def test_poison_of_an_offset_not_in_flight_changes_nothing() -> None:
    s = make(SubType.SHARED, policy("DeadLetter"))
    s.offer(0, "", 0)
    assert not s.on_poison(0, 0, "never delivered")
    assert [d.offset for d in s.poll(0)] == [0]
