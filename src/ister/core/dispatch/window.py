"""The window of a reliable subscription and its cursor.

The cursor is the highest offset below which everything is acknowledged or resolved. It never moves
backwards and never passes an offset that is still unresolved (docs/architecture.md §8, invariant 4).

`CursorTracker` is the standalone rule (offsets acknowledged out of order wait in a set until the gap below
them closes); `HeldWindow` is what the state machine uses: it knows every held offset, so its cursor simply
advances over offsets that are no longer held, each once, and jumps over skipped ranges (offsets the log
does not have) in one step each.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Sequence, Set
from itertools import chain

from ister.core.dispatch.entries import Entry, EntryState
from ister.core.dispatch.flight import Batch
from ister.core.dispatch.keyqueue import KeyQueues


class CursorTracker:
    __slots__ = ("_done", "_next", "start_offset")

    def __init__(self, start_offset: int) -> None:
        if start_offset < 0:
            raise ValueError(f"start_offset must be >= 0, got {start_offset}")
        self.start_offset = start_offset
        self._next = start_offset  # the lowest offset not yet acknowledged or resolved
        self._done: set[int] = set()

    @property
    def cursor(self) -> int | None:
        """The last contiguously resolved offset, or None while start_offset itself is unresolved."""
        return self._next - 1 if self._next > self.start_offset else None

    @property
    def first_unresolved(self) -> int:
        return self._next

    @property
    def out_of_order(self) -> int:
        """How many offsets are resolved above a gap."""
        return len(self._done)

    def is_resolved(self, offset: int) -> bool:
        return offset < self._next or offset in self._done

    def mark(self, offset: int) -> bool:
        """Record that `offset` is acknowledged or resolved; returns True if the cursor moved."""
        if offset < self._next or offset in self._done:
            return False
        if offset != self._next:
            self._done.add(offset)
            return False
        self._next += 1
        while self._next in self._done:
            self._done.remove(self._next)
            self._next += 1
        return True


class HeldWindow(Set[int]):
    """What a reliable subscription holds: offered, unresolved offsets, their records, and the cursor.

    It is also the live set view that `held_offsets` returns (membership O(1), iteration copies).

    - Never sent (all types but Key-Shared): the run [fresh, next_offset), kept as two integers (minus the
      skipped ranges inside it, if any).
    - Key-Shared: every held offset is in `keys.key_of`.
    - In flight: `holder` (shared with the FlightTable).
    - Failed or handed back at least once: a record in `entries`; `n_retry`/`n_exhausted` count its states.
    `first_open` is the lowest unresolved offset; it advances over resolved offsets once each.

    Skipped ranges (`skip`: offsets the log does not have) are in `gaps`, ascending and disjoint, until
    `first_open` passes them; they are never held and take no capacity. Each gap lies either wholly below
    `fresh` (the cursor jumps over it once everything below is resolved) or wholly inside the never-sent
    run [fresh, next_offset) (`unsent` leaves it out). Adjacent skips merge, so the gaps inside the
    never-sent run are at most one more than the never-sent offsets; below `fresh`, one per discontinuity
    the cursor has not passed yet.
    """

    __slots__ = (
        "entries",
        "first_open",
        "fresh",
        "gaps",
        "held",
        "holder",
        "keys",
        "n_exhausted",
        "n_retry",
        "next_offset",
        "resolved",
        "skipped",
        "start",
    )

    def __init__(
        self, start: int, holder: dict[int, Batch], keys: KeyQueues | None, track_resolved: bool
    ) -> None:
        self.start = start
        self.first_open = start
        self.next_offset = start
        self.fresh = start
        self.held = 0
        self.holder = holder
        self.keys = keys
        self.entries: dict[int, Entry] = {}
        self.n_retry = 0
        self.n_exhausted = 0
        self.resolved: list[int] | None = [] if track_resolved else None
        self.gaps: deque[tuple[int, int]] = deque()  # skipped [first, end) ranges the cursor has not passed
        self.skipped = 0  # offsets skipped in total

    # -- the set view --------------------------------------------------------------------------------------
    def __contains__(self, offset: object) -> bool:
        if not isinstance(offset, int):
            return False
        if self.keys is not None:
            return offset in self.keys.key_of
        if self.fresh <= offset < self.next_offset:
            return not self.gaps or not self._unsent_gap(offset)
        return offset in self.holder or offset in self.entries

    def __len__(self) -> int:
        return self.held

    def __iter__(self) -> Iterator[int]:
        if self.keys is not None:
            return iter(list(self.keys.key_of))
        waiting = [o for o, e in self.entries.items() if e.state is not EntryState.IN_FLIGHT]
        return chain(list(self.holder), waiting, self.unsent())

    # -- the never-sent run and skipped ranges ---------------------------------------------------------------
    def unsent(self) -> Sequence[int]:
        """All types but Key-Shared: the never-sent offsets [fresh, next_offset) minus skipped ranges."""
        lo, hi = self.fresh, self.next_offset
        gaps = self.gaps
        if not gaps or gaps[-1][0] < lo:
            return range(lo, hi)  # no gap inside the run: the common case
        inside: list[tuple[int, int]] = []
        for gap in reversed(gaps):
            if gap[0] < lo:
                break
            inside.append(gap)
        out: list[int] = []
        for first, end in reversed(inside):
            out.extend(range(lo, first))
            lo = end
        out.extend(range(lo, hi))
        return out

    def _unsent_gap(self, offset: int) -> bool:
        """Is `offset` (in [fresh, next_offset)) inside a skipped range?"""
        for first, end in reversed(self.gaps):  # descending: stop at the first one that starts below
            if first <= offset:
                return offset < end
        return False

    def skip(self, first: int, end: int) -> None:
        """The log has no records at [first, end); `first` is `next_offset` and end > first (checked by the
        caller). Takes no capacity; the cursor passes the range once everything below it is resolved."""
        gaps = self.gaps
        if gaps and gaps[-1][1] == first:
            gaps[-1] = (gaps[-1][0], end)  # right after another skip: one range
        else:
            gaps.append((first, end))
        if self.keys is None and self.fresh == first:  # nothing waits to be sent: no run to split
            self.fresh = end
        self.next_offset = end
        self.skipped += end - first
        self.advance()

    # -- cursor ----------------------------------------------------------------------------------------------
    @property
    def cursor(self) -> int | None:
        return self.first_open - 1 if self.first_open > self.start else None

    @property
    def sent_end(self) -> int:
        """One past the highest offset that may have been sent."""
        return self.next_offset if self.keys is not None else self.fresh

    def advance(self) -> None:
        """Move `first_open` past everything resolved (and skipped)."""
        if self.gaps:
            self._advance_over_gaps()
            return
        n = self.first_open
        if self.keys is not None:
            end, key_of = self.next_offset, self.keys.key_of
            while n < end and n not in key_of:
                n += 1
        else:
            end, holder, entries = self.fresh, self.holder, self.entries
            while n < end and n not in holder and n not in entries:
                n += 1
        self.first_open = n

    def _advance_over_gaps(self) -> None:
        """`advance` when skipped ranges wait: walk to the next gap, jump over it, and so on."""
        n = self.first_open
        gaps, holder, entries = self.gaps, self.holder, self.entries
        key_of = self.keys.key_of if self.keys is not None else None
        end = self.next_offset if key_of is not None else self.fresh
        while True:
            stop = min(end, gaps[0][0]) if gaps else end
            if key_of is not None:
                while n < stop and n not in key_of:
                    n += 1
            else:
                while n < stop and n not in holder and n not in entries:
                    n += 1
            if gaps and n == gaps[0][0] and n < end:
                n = gaps.popleft()[1]
                continue
            break
        self.first_open = n

    def span(self, first: int, last: int, late: bool) -> Sequence[int]:
        """Offsets in [first, last] that may be sent and unresolved: in flight, or (`late`) waiting.

        Clipped to the window; a wide, sparse span is answered from the held records instead of a scan,
        so it costs O(min(span, in flight + records)). Ascending.
        """
        lo = max(first, self.first_open)
        hi = min(last, self.sent_end - 1)
        if lo > hi:
            return ()
        holder, entries = self.holder, self.entries
        known = len(holder) + (len(entries) if late else 0)
        if hi - lo <= 2 * known + 64:
            return range(lo, hi + 1)
        pool: Iterable[int] = chain(holder, entries) if late else holder
        return sorted({o for o in pool if lo <= o <= hi})

    # -- records and resolution -----------------------------------------------------------------------------
    def state_of(self, offset: int) -> EntryState | None:
        if offset in self.holder:
            return EntryState.IN_FLIGHT
        entry = self.entries.get(offset)
        if entry is not None:
            return entry.state
        return EntryState.PENDING if offset in self else None

    def record(self, offset: int, consumer: int) -> Entry:
        """The record of a message just taken out of flight (made on its first failure or hand-back)."""
        entry = self.entries.get(offset)
        if entry is None:
            entry = self.entries[offset] = Entry(EntryState.IN_FLIGHT, 1, consumer)
        if self.keys is not None:
            self.keys.left_flight(offset)
        return entry

    def resolve(self, offset: int) -> None:
        """Drop a held offset that is out of flight; the caller then calls `advance`."""
        entry = self.entries.pop(offset, None)
        if entry is not None:
            self._uncount(entry)
        self.held -= 1
        if self.resolved is not None:
            self.resolved.append(offset)
        if self.keys is not None:
            self.keys.release(offset)

    def resolve_all(self, offsets: Sequence[int]) -> None:
        """`resolve` for many offsets."""
        self.held -= len(offsets)
        if self.resolved is not None:
            self.resolved.extend(offsets)
        entries = self.entries
        if entries:
            for offset in offsets:
                entry = entries.pop(offset, None)
                if entry is not None:
                    self._uncount(entry)
        if self.keys is not None:
            self.keys.release_all(offsets)

    def _uncount(self, entry: Entry) -> None:
        if entry.state is EntryState.RETRY:
            self.n_retry -= 1
        elif entry.state is EntryState.EXHAUSTED:
            self.n_exhausted -= 1

    def take_resolved(self) -> list[int]:
        if self.resolved is None:
            raise RuntimeError("take_resolved needs ReliableSubscriptionState(..., track_resolved=True)")
        out, self.resolved = self.resolved, []
        return out
