"""Offset ranges the local WAL cannot serve although they are below its next offset (thread-safe).

A hole is either *lost* (recovery found the segments end below the high-water checkpoint: the offsets were
acknowledged but their frames are gone; persisted in the checkpoint so a later open still knows it) or
*damaged* (a segment file holds a frame that fails validation; the readable part of that file ends there,
up to where a valid frame resumes or the next file begins; found again by every open or read).

Readers look holes up before reading files: a plain `WalReader` skips them (recording what it skipped), a
`TieredReader` reads them from the durable tier when it holds them. Each hole is logged once when found and
counted in `ister_offsets_damaged_total{topic}`.
"""

from __future__ import annotations

import logging
import threading
from bisect import bisect_right
from dataclasses import dataclass

from prometheus_client import Counter

log = logging.getLogger(__name__)

offsets_damaged = Counter(
    "ister_offsets_damaged_total",
    "Offsets found lost or damaged in the local WAL (counted once, when found)",
    ("topic",),
)


@dataclass(frozen=True, slots=True)
class Hole:
    first: int
    end: int  # exclusive
    lost: bool  # lost below the high-water mark (persisted) rather than a damaged range of a file
    why: str


class Holes:
    def __init__(self, label: str) -> None:
        self.label = label
        self._lock = threading.Lock()
        # (holes sorted by first and disjoint, their first offsets): replaced whole, never mutated in place,
        # so readers need no lock
        self._index: tuple[list[Hole], list[int]] = ([], [])
        self._reported: set[tuple[int, int, str]] = set()

    @property
    def _holes(self) -> list[Hole]:
        return self._index[0]

    def __bool__(self) -> bool:
        return bool(self._index[0])

    def find(self, offset: int) -> Hole | None:
        """The hole holding `offset`, or None."""
        holes, firsts = self._index
        if not holes:
            return None
        i = bisect_right(firsts, offset) - 1
        if i >= 0 and offset < holes[i].end:
            return holes[i]
        return None

    def add(self, first: int, end: int, *, lost: bool, why: str) -> list[Hole]:
        """Record [first, end); returns the parts that were not known yet (they are counted)."""
        if first >= end:
            return []
        with self._lock:
            new: list[Hole] = []
            at = first
            for h in self._holes:
                if h.end <= at or h.first >= end:
                    continue
                if h.first > at:
                    new.append(Hole(at, h.first, lost, why))
                at = max(at, h.end)
            if at < end:
                new.append(Hole(at, end, lost, why))
            if new:
                merged = sorted([*self._holes, *new], key=lambda h: h.first)
                self._index = (merged, [h.first for h in merged])
        if new:  # the series exists only for WALs that had damage (100,000 topics, few with holes)
            offsets_damaged.labels(self.label).inc(sum(h.end - h.first for h in new))
        return new

    def note_damaged(self, first: int, end: int, why: str) -> list[Hole]:
        """Record a damaged range [first, end) a reader found; each new part is logged and counted once."""
        new = self.add(first, end, lost=False, why=why)
        for hole in new:
            log.error(
                "WAL %s: offsets %d..%d are damaged (%s); readers take them from the durable tier if it "
                "holds them, otherwise they are skipped (data loss)",
                self.label,
                hole.first,
                hole.end - 1,
                why,
            )
        return new

    def prune(self, below: int) -> None:
        """Forget holes that end at or below `below` (the WAL's first offset moved past them)."""
        with self._lock:
            kept = [h for h in self._holes if h.end > below]
            if len(kept) != len(self._holes):
                self._index = (kept, [h.first for h in kept])

    def cut(self, end: int) -> None:
        """Forget everything at and above `end` (the log was truncated there): holes starting there go,
        a hole across it ends there."""
        with self._lock:
            kept = [
                h if h.end <= end else Hole(h.first, end, h.lost, h.why) for h in self._holes if h.first < end
            ]
            if kept != self._holes:
                self._index = (kept, [h.first for h in kept])

    def snapshot(self) -> list[Hole]:
        return list(self._holes)

    def ranges(self) -> list[tuple[int, int]]:
        """(first, end) of every hole, end exclusive, by first."""
        return [(h.first, h.end) for h in self._holes]

    def lost_ranges(self) -> tuple[tuple[int, int], ...]:
        return tuple((h.first, h.end) for h in self._holes if h.lost)

    def covers(self, first: int, end: int) -> bool:
        """True if every offset of [first, end) is in a hole (True for an empty range)."""
        at = first
        for h in self._holes:
            if h.end <= at:
                continue
            if h.first > at:
                return False
            at = h.end
            if at >= end:
                return True
        return at >= end

    def first_report(self, hole: Hole, what: str) -> bool:
        """True the first time `what` is reported for `hole` (callers log only then)."""
        key = (hole.first, hole.end, what)
        with self._lock:
            if key in self._reported:
                return False
            if len(self._reported) >= 4096:
                self._reported.clear()
            self._reported.add(key)
            return True


__all__ = ["Hole", "Holes", "offsets_damaged"]
