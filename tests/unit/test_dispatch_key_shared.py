from __future__ import annotations

from ister.core.dispatch import (
    Delivery,
    EntryState,
    FailurePolicy,
    HashRing,
    ReliableSubscriptionState,
    SubType,
)

POLICY = FailurePolicy(ack_timeout_ms=1_000, base_redelivery_delay_ms=0, max_redelivery_count=10)


def make(window: int = 100) -> ReliableSubscriptionState:
    return ReliableSubscriptionState(SubType.KEY_SHARED, start_offset=0, window=window, policy=POLICY)


def offer(s: ReliableSubscriptionState, *keys: str) -> list[int]:
    out = []
    for key in keys:
        out.append(s.next_offset)
        s.offer(s.next_offset, key, 0)
    return out


def by_offset(ds: list[Delivery]) -> dict[int, int]:
    return {d.offset: d.consumer_id for d in ds}


def test_several_in_flight_per_key_in_order() -> None:
    """Issue 36: a key's messages go to its consumer without waiting for each ack (Danube: one at a time)."""
    s = make()
    s.attach(1, (), 0)
    offer(s, "a", "b", "a", "a", "b")
    assert [d.offset for d in s.poll(0)] == [0, 1, 2, 3, 4]
    assert s.poll(0) == []
    assert not s.on_ack(5, 1)  # never delivered: ignored
    assert s.on_ack(2, 1)  # out of order within a key: fine, the cursor waits for 0
    assert s.cursor is None
    offer(s, "a")
    assert s.poll(2) == [Delivery(1, 5, 1, False)]
    assert s.on_ack(0, 3) and s.on_ack(1, 3)
    assert s.cursor == 2


def test_a_key_waits_behind_its_message_to_send_again() -> None:
    """A nacked message of a key goes before any later message of that key; other keys flow on."""
    s = make()
    s.attach(1, (), 0)
    offer(s, "k", "k", "k", "j")
    assert [d.offset for d in s.poll(0)] == [0, 1, 2, 3]
    assert s.on_nack(0, 1, delay_ms=500)
    offer(s, "k", "j")
    assert s.poll(2) == [Delivery(1, 5, 1, False)]  # 4 (key k) waits behind 0; 5 (key j) goes
    assert s.poll(501) == [Delivery(1, 0, 2, True), Delivery(1, 4, 1, False)]


def test_retries_of_one_key_go_in_offset_order() -> None:
    """A later message's retry that is due first waits for the earlier one of its key."""
    s = make()
    s.attach(1, (), 0)
    offer(s, "k", "k")
    s.poll(0)
    assert s.on_nack(0, 1, delay_ms=300) and s.on_nack(1, 1, delay_ms=100)
    assert s.poll(101) == []  # 1 is due but 0 is not
    assert s.poll(301) == [Delivery(1, 0, 2, True), Delivery(1, 1, 2, True)]


def test_out_of_order_acks_across_keys() -> None:
    s = make()
    s.attach(1, (), 0)
    offer(s, *[f"k{i}" for i in range(10)])
    assert len(s.poll(0)) == 10
    for off in reversed(range(10)):
        assert s.on_ack(off, 1)
    assert s.cursor == 9


def test_affinity_follows_the_ring() -> None:
    s = make(window=1000)
    s.attach(1, (), 0)
    s.attach(2, (), 0)
    keys = [f"key-{i}" for i in range(10)]
    ring = HashRing([1, 2])
    for _ in range(3):
        offs = offer(s, *keys)
        ds = s.poll(0)
        assert [d.offset for d in ds] == offs
        assert [d.consumer_id for d in ds] == [ring.lookup(k) for k in keys]
        for off in offs:
            s.on_ack(off, 0)
    assert {ring.lookup(k) for k in keys} == {1, 2}


def test_in_flight_key_keeps_its_holder_when_ring_changes() -> None:
    s = make()
    s.attach(1, (), 0)
    offer(s, *[f"k{i}" for i in range(40)])
    first = s.poll(0)
    assert {d.consumer_id for d in first} == {1}
    s.attach(2, (), 1)
    assert s.poll(1) == []
    assert set(s.in_flight().values()) == {1}
    # after the ack, the next message of each key goes to its new ring owner
    ring = HashRing([1, 2])
    nxt = offer(s, *[f"k{i}" for i in range(40)])
    for d in first:
        s.on_ack(d.offset, 2)
    ds = s.poll(2)
    assert [d.offset for d in ds] == nxt
    assert [d.consumer_id for d in ds] == [ring.lookup(f"k{i}") for i in range(40)]


def test_detach_keeps_key_lock_and_redelivers_to_survivor() -> None:
    s = make()
    s.attach(1, (), 0)
    s.attach(2, (), 0)
    keys = [f"k{i}" for i in range(20)]
    offer(s, *keys)
    offer(s, *keys)
    ds = s.poll(0)
    assert [d.offset for d in ds] == list(range(40))
    lost = sorted(d.offset for d in ds if d.consumer_id == 2)
    assert lost
    s.detach(2, 5)
    again = s.poll(5)
    # the detached consumer's messages come back, in order, to the survivor
    assert [d.offset for d in again] == lost
    assert all(d.consumer_id == 1 and d.redelivery for d in again)
    s.attach(2, (), 6)
    offer(s, *keys)
    ds = s.poll(6)  # keys moving back to 2 wait while 1 holds their messages; the others flow
    assert ds and all(d.consumer_id == 1 for d in ds)
    assert {keys[d.offset - 40] for d in ds} == {k for k in keys if HashRing([1, 2]).lookup(k) == 1}


def test_filtered_out_key_is_held_not_skipped() -> None:
    s = make()
    s.attach(1, ["eu-*"], 0)
    offer(s, "us-1", "eu-1", "us-1")
    assert [d.offset for d in s.poll(0)] == [1]
    s.on_ack(1, 1)
    assert s.cursor is None  # offset 0 held: the cursor cannot pass it
    assert s.state_of(0) is EntryState.PENDING
    assert s.poll(2) == []
    s.attach(2, ["us-*"], 3)
    assert s.poll(3) == [Delivery(2, 0, 1, False), Delivery(2, 2, 1, False)]
    s.on_ack(0, 4)
    assert s.cursor == 1


def test_filters_route_each_family() -> None:
    s = make()
    s.attach(1, ["eu-*"], 0)
    s.attach(2, ["us-*"], 0)
    offer(s, "eu-1", "us-1", "eu-2", "us-2")
    assert by_offset(s.poll(0)) == {0: 1, 1: 2, 2: 1, 3: 2}


def test_retry_waiting_for_an_eligible_consumer() -> None:
    s = make()
    s.attach(1, ["a*"], 0)
    offer(s, "a1")
    s.poll(0)
    s.detach(1, 1)
    s.attach(2, ["b*"], 2)
    assert s.poll(2) == []  # no one accepts "a1": held
    s.attach(3, (), 3)
    assert s.poll(3) == [Delivery(3, 0, 2, True)]


def test_ack_timeout_keeps_key_order() -> None:
    s = make()
    s.attach(1, (), 0)
    offer(s, "k", "k")
    assert [d.offset for d in s.poll(0)] == [0, 1]
    offer(s, "k")
    # both timed out and are retried at once (delay 0), in order, before the key's never-sent message
    assert [(d.offset, d.redelivery) for d in s.poll(1_000)] == [(0, True), (1, True), (2, False)]


def test_unmatched_keys_take_no_window_slots() -> None:
    """Issue 14 item 0: a key no attached consumer's filters accept waits for one, without holding window
    slots, so the other keys keep flowing (with a window of 2, two such messages used to stall everything)."""
    s = make(window=2)
    s.attach(1, ["payment"], 0)
    offer(s, "shipping", "invoice")
    assert s.poll(0) == []  # nobody takes them yet
    assert s.capacity() == 2  # ... and they hold no slot
    offer(s, "shipping")  # a later message of an unmatched key holds none either
    offer(s, "payment", "payment")
    assert s.capacity() == 0
    assert s.poll(1) == [Delivery(1, 3, 1, False), Delivery(1, 4, 1, False)]
    assert s.on_ack(3, 2)
    assert s.on_ack(4, 3) and s.cursor is None  # offset 0 is still held
    s.attach(2, ["ship*", "invoice"], 4)  # a consumer for them: they go, in order per key
    assert s.capacity() == 0  # counted again until the next poll routes them
    assert by_offset(s.poll(4)) == {0: 2, 1: 2, 2: 2}
    assert s.on_ack(0, 5) and s.on_ack(1, 5)
    assert s.on_ack(2, 6) and s.cursor == 4


def test_unmatched_keys_are_bounded() -> None:
    """Past `unmatched_limit` held messages of unmatched keys, they take window slots again (memory bound)."""
    s = ReliableSubscriptionState(
        SubType.KEY_SHARED, start_offset=0, window=2, policy=POLICY, unmatched_limit=3
    )
    s.attach(1, ["a"], 0)
    offer(s, "x", "y")
    s.poll(0)
    assert s.capacity() == 2
    offer(s, "x", "z")
    s.poll(1)
    assert s.capacity() == 1  # 4 unmatched held, 3 of them free of the window
    offer(s, "a")
    assert s.capacity() == 0
    assert s.poll(2) == [Delivery(1, 4, 1, False)]


def test_unmatched_retry_takes_no_window_slot() -> None:
    """A message handed back while no consumer accepts its key any more is unmatched too."""
    s = make(window=1)
    s.attach(1, ["x"], 0)
    offer(s, "x")
    assert s.poll(0) == [Delivery(1, 0, 1, False)]
    s.detach(1, 1)
    s.attach(2, ["a"], 1)
    assert s.poll(1) == []
    assert s.capacity() == 1
    offer(s, "a")
    assert s.poll(2) == [Delivery(2, 1, 1, False)]
    s.attach(1, ["x"], 3)
    assert s.poll(3) == [Delivery(1, 0, 2, True)]


def test_a_moving_key_waits_for_its_delivered_message_and_other_keys_never_pause() -> None:
    """Issue 19 item 3: when a consumer joins and hash ranges move, only keys in the moving ranges wait, and
    a moving key's next message goes to its new consumer only once the old one acknowledged (or timed
    out) what it was given."""
    from ister.core.dispatch import FailurePolicy, ReliableSubscriptionState, SubType

    st = ReliableSubscriptionState(SubType.KEY_SHARED, start_offset=0, window=100, policy=FailurePolicy())
    st.attach(1, (), 0)
    keys = [f"k{i}" for i in range(40)]
    st.offer_batch(0, keys, 0)
    first = {d.offset: d.consumer_id for d in st.poll(0)}
    assert set(first.values()) == {1} and len(first) == 40  # one message per key, all to consumer 1
    st.attach(2, (), 2)
    st.offer_batch(40, keys, 1)  # a second message of every key
    moving = [i for i, k in enumerate(keys) if st._selector.for_key(k) == 2]
    staying = [i for i in range(40) if i not in moving]
    assert moving and staying
    staying_next = {d.offset: d.consumer_id for d in st.poll(3)}
    # unaffected keys flow on to their owner at once; moving keys wait while consumer 1 holds their first
    assert staying_next == {40 + i: 1 for i in staying}
    st.on_ack(moving[0], 6)  # one moving key's first message is acknowledged by its old consumer
    assert {(d.offset, d.consumer_id) for d in st.poll(7)} == {(40 + moving[0], 2)}
