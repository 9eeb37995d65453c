"""The dedup table's rules one at a time (core/dedup.py) and the idempotence tag on stored records."""

from __future__ import annotations

import msgspec
import pytest

from ister.core.dedup import DedupTable
from ister.core.record import (
    LeanMessage,
    StoredMessage,
    array_header,
    decode_message,
    decode_published,
    encode_message,
    idem_tag_of,
    tag_record,
)
from ister.errors import DuplicateSequence, InvalidArgument, OutOfOrderSequence


def stored(t: DedupTable, key: int, first: int, count: int, offset: int, now: int = 0) -> None:
    assert t.check(key, first, count, now).duplicate is None
    t.stored(t.accept(key, first, count, now), offset)


def test_new_duplicate_gap_and_overlap() -> None:
    t = DedupTable()
    stored(t, 9, 0, 3, 100)
    stored(t, 9, 3, 2, 200)
    dup = t.check(9, 0, 3, 1).duplicate
    assert dup is not None and dup.first_offset == 100
    with pytest.raises(OutOfOrderSequence, match="expected 5"):
        t.check(9, 6, 1, 1)
    with pytest.raises(DuplicateSequence, match="not as a batch remembered"):
        t.check(9, 1, 3, 1)
    with pytest.raises(OutOfOrderSequence, match="overlapping"):  # part stored, part not
        t.check(9, 4, 2, 1)
    assert t.check(9, 5, 1, 1).duplicate is None
    assert t.check(10, 77, 1, 1).duplicate is None  # an unknown key starts anywhere


def test_bad_identity_is_refused() -> None:
    t = DedupTable()
    for key, first, count in ((0, 0, 1), (2**64, 0, 1), (1, -1, 1), (1, 0, 0), (1, 2**64 - 1, 2)):
        with pytest.raises(ValueError, match="bad batch identity"):
            t.check(key, first, count, 0)


def test_least_recently_used_producer_is_evicted_first() -> None:
    t = DedupTable(max_producers=2, window_ms=10**9)
    stored(t, 1, 0, 1, 0)
    stored(t, 2, 0, 1, 1)
    stored(t, 1, 1, 1, 2)  # 1 is used again: 2 is the least recently used
    stored(t, 3, 0, 1, 3)
    assert sorted(t.snapshot()) == [1, 3] and t.evicted == 1
    assert t.check(2, 0, 1, 0).duplicate is None  # forgotten: a retry would be stored again


def test_idle_producers_leave_after_the_window() -> None:
    t = DedupTable(window_ms=1_000)
    stored(t, 1, 0, 1, 0, now=0)
    stored(t, 2, 0, 1, 1, now=600)
    t.expire(1_001)
    assert list(t.snapshot()) == [2]


def test_only_the_newest_batches_are_remembered() -> None:
    t = DedupTable(max_batches=2)
    for i in range(4):
        stored(t, 1, i, 1, 10 + i)
    assert t.check(1, 3, 1, 0).duplicate is not None
    with pytest.raises(DuplicateSequence):
        t.check(1, 1, 1, 0)


def test_a_failed_append_rolls_the_producer_back() -> None:
    t = DedupTable()
    stored(t, 1, 0, 2, 0)
    a = t.accept(1, 2, 1, 0)
    b = t.accept(1, 3, 1, 0)
    t.failed(1, a)  # b, in flight, may still be stored: a is a hole until b's append ends too
    assert t.snapshot()[1] == (4, [(0, 2, 0), (3, 1, None)])
    assert t.check(1, 2, 1, 0).duplicate is None
    t.failed(1, b)
    assert t.snapshot()[1] == (2, [(0, 2, 0)])
    assert t.check(1, 2, 1, 0).duplicate is None


def test_restore_replays_the_log_and_skips_what_it_holds_twice() -> None:
    t = DedupTable()
    t.restore(1, 0, 2, 0, 5)
    t.restore(1, 0, 2, 7, 5)  # the same batch again further on (stored before idempotence existed)
    t.restore(1, 2, 1, 9, 6)
    t.restore(0, 0, 1, 10, 6)  # a nonsense tag is ignored
    assert t.snapshot() == {1: (3, [(0, 2, 0), (2, 1, 9)])}


def test_tag_record_appends_a_ninth_element_readers_ignore() -> None:
    m = StoredMessage(b"p", 5, 2, "prod", {"a": "b"}, "k", 3, 4)
    tagged = tag_record(encode_message(m), 0xFFFF_FFFF_FFFF_FFFF, 7, 3)
    assert idem_tag_of(tagged) == (0xFFFF_FFFF_FFFF_FFFF, 7, 3)
    assert decode_message(tagged) == m
    assert msgspec.msgpack.Decoder(LeanMessage).decode(tagged).payload == b"p"
    assert idem_tag_of(encode_message(m)) is None
    assert idem_tag_of(b"\xc1garbage") is None
    # A client cannot send a tag itself: published records have at most 8 fields.
    with pytest.raises(InvalidArgument):
        decode_published(array_header(1) + tagged)


def test_tag_record_pads_a_short_record() -> None:
    short = msgspec.msgpack.encode([b"p", 5, 2, "prod"])
    tagged = tag_record(short, 1, 0, 1)
    assert decode_message(tagged) == StoredMessage(b"p", 5, 2, "prod")
    assert idem_tag_of(tagged) == (1, 0, 1)
    with pytest.raises(InvalidArgument):
        tag_record(msgspec.msgpack.encode({"a": 1}), 1, 0, 1)


def test_a_failed_append_before_a_stored_one_leaves_a_hole_its_retry_fills() -> None:
    """Batch A's append fails with nothing stored while B, sent after it, is stored (the disk was full for A
    alone): the re-sent A is stored, the re-sent B is answered with its offsets, not stored again."""
    t = DedupTable()
    stored(t, 3, 0, 2, 10)
    a = t.accept(3, 2, 2, 0)
    b = t.accept(3, 4, 3, 0)
    t.failed(3, a)
    t.stored(b, 12)
    assert t.check(3, 2, 2, 1).duplicate is None  # A again: new
    t.stored(t.accept(3, 2, 2, 1), 15)
    dup = t.check(3, 4, 3, 1).duplicate  # B again: the original offsets
    assert dup is not None and dup.first_offset == 12
    assert t.check(3, 7, 1, 1).duplicate is None  # the next batch follows B
    with pytest.raises(DuplicateSequence):
        t.check(3, 2, 1, 1)  # A is stored now: part of it is a duplicate
    # Both fail, the later one first or last: the key falls back to A's first sequence, no hole left.
    for order in ((0, 1), (1, 0)):
        u = DedupTable()
        stored(u, 3, 0, 2, 10)
        pair = [u.accept(3, 2, 2, 0), u.accept(3, 4, 3, 0)]
        for i in order:
            u.failed(3, pair[i])
        assert u.snapshot()[3][0] == 2
        assert u.check(3, 2, 2, 1).duplicate is None
    # A's re-send fails again, in two parts: the hole is whole again.
    h = DedupTable()
    a = h.accept(3, 0, 4, 0)
    h.accept(3, 4, 1, 0)
    h.failed(3, a)
    parts = [h.accept(3, 0, 2, 0), h.accept(3, 2, 2, 0)]
    for p in parts:
        h.failed(3, p)
    assert h.state(3) is not None and h.state(3).holes == [(0, 4)]  # type: ignore[union-attr]
    assert h.check(3, 0, 4, 1).duplicate is None
    # Rebuilt from the log (B's tag, then A's re-sent copy after it): the same answers.
    r = DedupTable()
    r.restore(3, 0, 2, 10, 0)
    r.restore(3, 4, 3, 12, 0)
    assert r.check(3, 2, 2, 1).duplicate is None  # the hole, learnt from the log: A's retry is stored
    r.restore(3, 2, 2, 15, 0)
    dup = r.check(3, 2, 2, 1).duplicate
    assert dup is not None and dup.first_offset == 15
    dup = r.check(3, 4, 3, 1).duplicate
    assert dup is not None and dup.first_offset == 12
