"""Idempotent producers: which batches of a topic's recent producers are stored (pure; time as an argument).

A producer with idempotence on sends each batch with its `producer_key` (a random non-zero 64-bit number
the client draws once per producer object) and the sequence number of the batch's first message; message
sequences count 0, 1, 2, ... per producer and topic (partition), with no gaps. Per topic the broker keeps,
for each recent producer, the last sequence it accepted and its newest batches with their first offsets:

- `first == last + 1`: a new batch (the only one that is stored);
- a batch equal to a remembered one (same first sequence and count): a retry, answered with the original
  offsets and not stored again;
- `first > last + 1`: a gap (messages lost between client and broker, or two producers sharing a key):
  refused with `OutOfOrderSequence`;
- a batch inside the stored range that is not a remembered batch (different boundaries, or older than the
  remembered ones): refused with `DuplicateSequence` (its messages are stored, their offsets unknown);
- a batch that starts inside the stored range and ends past it (cut otherwise than the stored batches):
  refused with `OutOfOrderSequence` (part of it is stored, the rest is not);
- an unknown key: accepted whatever its first sequence (a new producer, or one evicted from the window).

Bounded: at most `max_producers` keys (least recently used evicted first), a key idle for `window_ms` is
forgotten, at most `max_batches` batches remembered per key (the client keeps at most that many batches
unacknowledged, so a retry always finds its batch). After an eviction a retry of that producer is stored
again: the window is the promise. The table is rebuilt from the log (`restore`) after a restart, a move or
a failover, from the tags the broker puts on each batch's first record (`ister.core.record.tag_record`).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

from ister.errors import DuplicateSequence, OutOfOrderSequence

DEFAULT_MAX_PRODUCERS = 10_000
DEFAULT_WINDOW_MS = 3_600_000  # an hour: longer than any client's retry budget
DEFAULT_MAX_BATCHES = 64  # the broker's max in-flight batches per publish stream
U64_MAX = 2**64 - 1


@dataclass(slots=True)
class StoredBatch:
    first_seq: int
    count: int
    first_offset: int | None  # None while its append is in flight

    @property
    def end_seq(self) -> int:
        return self.first_seq + self.count


@dataclass(slots=True)
class ProducerState:
    next_seq: int  # the first sequence of the next new batch
    seen_ms: int
    batches: deque[StoredBatch] = field(default_factory=deque)  # in sequence order
    # [first, end) ranges below next_seq with nothing stored: a batch whose append failed while a later
    # one of the key was stored (or in flight). Their re-sent batches are new.
    holes: list[tuple[int, int]] = field(default_factory=list)

    def hole_of(self, first: int, end: int) -> int | None:
        for i, (a, b) in enumerate(self.holes):
            if a <= first and end <= b:
                return i
        return None


@dataclass(frozen=True, slots=True)
class Verdict:
    """`duplicate` set: a retry of that batch (its `first_offset` may still be None: in flight)."""

    duplicate: StoredBatch | None = None


NEW = Verdict()


class DedupTable:
    def __init__(
        self,
        max_producers: int = DEFAULT_MAX_PRODUCERS,
        window_ms: int = DEFAULT_WINDOW_MS,
        max_batches: int = DEFAULT_MAX_BATCHES,
    ) -> None:
        if max_producers < 1 or window_ms < 1 or max_batches < 1:
            raise ValueError("max_producers, window_ms and max_batches must be >= 1")
        self.max_producers = max_producers
        self.window_ms = window_ms
        self.max_batches = max_batches
        self._producers: OrderedDict[int, ProducerState] = OrderedDict()  # least recently used first
        self.evicted = 0  # keys forgotten (window or count), for a metric

    def __len__(self) -> int:
        return len(self._producers)

    def state(self, key: int) -> ProducerState | None:
        return self._producers.get(key)

    def expire(self, now_ms: int) -> None:
        """Forget keys idle past the window, and the least recently used past the count bound."""
        producers = self._producers
        horizon = now_ms - self.window_ms
        while producers:
            key, oldest = next(iter(producers.items()))
            if oldest.seen_ms > horizon and len(producers) <= self.max_producers:
                return
            del producers[key]
            self.evicted += 1

    def check(self, key: int, first_seq: int, count: int, now_ms: int) -> Verdict:
        """What to do with a batch; raises OutOfOrderSequence or DuplicateSequence. Changes nothing."""
        if not 0 < key <= U64_MAX or first_seq < 0 or count < 1 or first_seq + count - 1 > U64_MAX:
            raise ValueError(f"bad batch identity: key {key}, sequences {first_seq}+{count}")
        self.expire(now_ms)
        st = self._producers.get(key)
        if st is None or first_seq == st.next_seq:
            return NEW
        if st.holes and st.hole_of(first_seq, first_seq + count) is not None:
            return NEW  # the re-send of a batch whose append failed
        if first_seq > st.next_seq:
            raise OutOfOrderSequence(
                f"out of order sequence: producer {key:#x} sent sequence {first_seq}, "
                f"expected {st.next_seq} (messages {st.next_seq}..{first_seq - 1} never arrived)"
            )
        for b in reversed(st.batches):
            if b.first_seq == first_seq and b.count == count:
                return Verdict(b)
            if b.first_seq < first_seq:
                break
        end = first_seq + count
        if end > st.next_seq:  # some of it stored, the rest not: storing the rest alone has no one offset
            raise OutOfOrderSequence(
                f"out of order sequence: producer {key:#x} sent sequences {first_seq}..{end - 1} overlapping "
                f"what is stored (up to {st.next_seq - 1}, in batches cut otherwise: a re-sent batch must be "
                "cut as it first was)"
            )
        raise DuplicateSequence(
            f"duplicate sequence: producer {key:#x} sent sequences {first_seq}..{first_seq + count - 1}, "
            f"stored up to {st.next_seq - 1}, not as a batch remembered (offsets unknown)"
        )

    def accept(self, key: int, first_seq: int, count: int, now_ms: int) -> StoredBatch:
        """Record a NEW batch as in flight (call `stored` or `failed` when its append ends)."""
        b = StoredBatch(first_seq, count, None)
        self._add(key, b, now_ms)
        return b

    def _add(self, key: int, b: StoredBatch, now_ms: int) -> None:
        producers = self._producers
        st = producers.get(key)
        if st is None:
            st = producers[key] = ProducerState(b.end_seq, now_ms)
        else:
            producers.move_to_end(key)
            st.seen_ms = max(st.seen_ms, now_ms)
            if b.first_seq < st.next_seq:  # into a hole
                self._fill(st, b)
                return
            st.next_seq = b.end_seq
        st.batches.append(b)
        if len(st.batches) > self.max_batches:
            st.batches.popleft()
        if len(producers) > self.max_producers:
            self.expire(now_ms)

    @staticmethod
    def _fill(st: ProducerState, b: StoredBatch) -> None:
        """`b` takes (part of) a hole: the hole shrinks, `b` joins the batches in sequence order."""
        i = st.hole_of(b.first_seq, b.end_seq)
        if i is not None:
            a, e = st.holes.pop(i)
            st.holes[i:i] = [r for r in ((a, b.first_seq), (b.end_seq, e)) if r[0] < r[1]]
        batches = st.batches
        at = len(batches)
        while at and batches[at - 1].first_seq > b.first_seq:
            at -= 1
        batches.insert(at, b)

    @staticmethod
    def stored(batch: StoredBatch, first_offset: int) -> None:
        batch.first_offset = first_offset

    def failed(self, key: int, batch: StoredBatch) -> None:
        """The append of `batch` failed with nothing stored: forget it. Its sequences are taken again by its
        re-send: as the key's next ones when no later batch is stored or in flight, else as a hole (a later
        batch of the stream may still be stored: forgetting it would store its re-send twice)."""
        st = self._producers.get(key)
        if st is None or batch not in st.batches:
            return
        st.batches.remove(batch)
        if batch.end_seq < st.next_seq:
            merged: list[tuple[int, int]] = []
            for a, e in sorted([*st.holes, (batch.first_seq, batch.end_seq)]):
                if merged and merged[-1][1] == a:  # a hole's re-send failed again: one hole, as before
                    a = merged.pop()[0]
                merged.append((a, e))
            st.holes = merged
            return
        st.next_seq = batch.first_seq
        while st.holes and st.holes[-1][1] >= st.next_seq:  # holes now at the end are no holes
            st.next_seq = min(st.next_seq, st.holes.pop()[0])
        if not st.batches and st.next_seq == 0:
            del self._producers[key]

    def restore(self, key: int, first_seq: int, count: int, first_offset: int, publish_ms: int) -> None:
        """Replay one tagged batch read from the log, in offset order (publish_ms: its record's time)."""
        if not 0 < key <= U64_MAX or first_seq < 0 or count < 1:
            return  # a tag that does not make sense is ignored: dedup is lost for it, nothing else
        st = self._producers.get(key)
        if st is not None and first_seq < st.next_seq:
            if st.hole_of(first_seq, first_seq + count) is not None:  # a re-send after a failed append
                self._add(key, StoredBatch(first_seq, count, first_offset), publish_ms)
            return  # otherwise a batch the log holds twice (stored before idempotence, or an older owner)
        if st is not None and first_seq > st.next_seq:  # appends that failed before a later one stored
            st.holes.append((st.next_seq, first_seq))
        self._add(key, StoredBatch(first_seq, count, first_offset), publish_ms)

    def snapshot(self) -> dict[int, tuple[int, list[tuple[int, int, int | None]]]]:
        """key -> (next sequence, remembered batches): for tests and the admin view."""
        return {
            k: (st.next_seq, [(b.first_seq, b.count, b.first_offset) for b in st.batches])
            for k, st in self._producers.items()
        }
