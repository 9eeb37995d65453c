"""Which offsets of a topic were found missing, so each is counted and reported once.

Readers (subscriptions, ranged reads) skip offsets that exist nowhere: the unexported tail of a broker whose
disk is gone, the unused rest of a dead owner's offset reservation, a damaged range with no copy. Every
reader of the topic meets the same gap; the ledger merges what they report into disjoint ranges and says
which part of each report is new, so a metric counts every missing offset once and a gap is logged once.
"""

from __future__ import annotations

from bisect import bisect_left

MAX_RANGES = 1024  # beyond this the oldest ranges are forgotten (they may then be counted again)


class GapLedger:
    __slots__ = ("_ends", "_starts")

    def __init__(self) -> None:
        self._starts: list[int] = []  # disjoint, sorted, non-adjacent [start, end) ranges
        self._ends: list[int] = []

    def add(self, first: int, end: int) -> list[tuple[int, int]]:
        """Record that offsets [first, end) are missing; returns the sub-ranges not recorded before."""
        if end <= first:
            return []
        starts, ends = self._starts, self._ends
        # ranges overlapping or touching [first, end): indices lo..hi-1
        lo = bisect_left(ends, first)
        hi = lo
        new: list[tuple[int, int]] = []
        at = first
        while hi < len(starts) and starts[hi] <= end:
            if starts[hi] > at:
                new.append((at, starts[hi]))
            at = max(at, ends[hi])
            hi += 1
        if at < end:
            new.append((at, end))
        merged_start = min(first, starts[lo]) if lo < hi else first
        merged_end = max(end, ends[hi - 1]) if lo < hi else end
        starts[lo:hi] = [merged_start]
        ends[lo:hi] = [merged_end]
        if len(starts) > MAX_RANGES:
            del starts[0], ends[0]
        return new

    def ranges(self) -> list[tuple[int, int]]:
        return list(zip(self._starts, self._ends, strict=True))
