"""Bounded in-memory cache of the most recent committed records (event-loop thread only).

Records are kept in chunks, one per append call, so committing costs O(1) per append, not per record.
The cache always holds one contiguous offset range [first_offset, end_offset) ending at the committed
offset; eviction drops the oldest chunks.

Each cache has its own cap, and the caches of one broker share a `CacheBudget`: when their total passes it,
the caches added to longest ago give up their oldest chunks first (an idle topic's records before a busy
topic's). A record that left the cache is read from the segment files, so eviction costs speed, never data.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Sequence

from ister.core.frames import HEADER_SIZE

CHUNK_OVERHEAD = 64  # rough per-chunk bookkeeping cost counted against the budget


class CacheBudget:
    """The memory all record caches of a process may hold together (`limit` bytes; 0: no shared limit)."""

    __slots__ = ("_holders", "limit", "total")

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError("a cache budget must be >= 0 bytes")
        self.limit = limit
        self.total = 0
        # the caches holding records, least recently added to first
        self._holders: OrderedDict[RecordCache, None] = OrderedDict()

    def _changed(self, cache: RecordCache, delta: int, added: bool) -> None:
        self.total += delta
        if cache.nbytes == 0:
            self._holders.pop(cache, None)
        elif added:
            self._holders[cache] = None
            self._holders.move_to_end(cache)
            if self.limit and self.total > self.limit:
                self._reclaim(cache)

    def _reclaim(self, adder: RecordCache) -> None:
        holders = self._holders
        while self.total > self.limit:
            oldest = next(iter(holders))  # the adder was moved to the end: every other cache comes first
            if oldest is adder:
                # its newest chunk stays: the topic's live readers take it from here
                adder.shed(self.total - self.limit, keep_newest=True)
                return
            oldest.shed(self.total - self.limit, keep_newest=False)  # frees enough, or empties and leaves


class RecordCache:
    __slots__ = ("_budget", "_bytes", "_chunks", "_end", "_firsts", "_head", "_max_bytes", "_sizes")

    def __init__(self, max_bytes: int, budget: CacheBudget | None = None) -> None:
        self._budget = budget
        self._max_bytes = max_bytes
        self._firsts: list[int] = []
        # Tuples, not lists: a tuple of payloads (no references to other objects) drops out of the cyclic
        # garbage collector at its first collection, so a full collection never walks cached records.
        self._chunks: list[tuple[bytes, ...]] = []
        self._sizes: list[int] = []
        self._head = 0  # index of the oldest live chunk (lists are compacted lazily)
        self._bytes = 0
        self._end = 0

    @property
    def nbytes(self) -> int:
        return self._bytes

    @property
    def chunks(self) -> int:
        return len(self._firsts) - self._head

    @property
    def first_offset(self) -> int:
        """Oldest cached offset (== end_offset when empty)."""
        return self._firsts[self._head] if self._head < len(self._firsts) else self._end

    @property
    def end_offset(self) -> int:
        return self._end

    def reset(self, end_offset: int) -> None:
        before = self._bytes
        self._reset(end_offset)
        self._report(before, added=False)

    def _report(self, before: int, *, added: bool) -> None:
        if self._budget is not None and (self._bytes != before or added):
            self._budget._changed(self, self._bytes - before, added)

    def _reset(self, end_offset: int) -> None:
        self._firsts.clear()
        self._chunks.clear()
        self._sizes.clear()
        self._head = 0
        self._bytes = 0
        self._end = end_offset

    def truncate(self, end: int) -> None:
        """Forget the records at and above `end` (the log was cut there)."""
        if end >= self._end:
            return
        before = self._bytes
        self._truncate(end)
        self._report(before, added=False)

    def _truncate(self, end: int) -> None:
        firsts = self._firsts
        head = self._head
        if head >= len(firsts) or end <= firsts[head]:
            self._reset(end)
            return
        i = bisect_right(firsts, end - 1, lo=head) - 1  # the chunk holding end - 1
        for j in range(i + 1, len(firsts)):
            self._bytes -= self._sizes[j]
        del firsts[i + 1 :]
        del self._chunks[i + 1 :]
        del self._sizes[i + 1 :]
        kept = self._chunks[i][: end - firsts[i]]
        size = sum(len(p) for p in kept) + HEADER_SIZE * len(kept) + CHUNK_OVERHEAD
        self._bytes += size - self._sizes[i]
        self._chunks[i] = kept
        self._sizes[i] = size
        self._end = end

    def add(self, first_offset: int, payloads: Sequence[bytes], payload_bytes: int) -> None:
        """Append a committed chunk; it must start at end_offset (otherwise the cache restarts there)."""
        before = self._bytes
        if first_offset != self._end:
            self._reset(first_offset)
        size = payload_bytes + HEADER_SIZE * len(payloads) + CHUNK_OVERHEAD
        self._firsts.append(first_offset)
        self._chunks.append(tuple(payloads))
        self._sizes.append(size)
        self._bytes += size
        self._end = first_offset + len(payloads)
        self._evict(self._max_bytes)
        self._report(before, added=True)

    def shed(self, nbytes: int, *, keep_newest: bool) -> None:
        """Drop the oldest chunks, at least `nbytes` of them if there are that many (but not the newest one
        when `keep_newest`): the shared budget asks this of caches when their total is over it."""
        if self._head >= len(self._firsts):
            return
        before = self._bytes
        self._evict(max(self._bytes - nbytes, self._sizes[-1] if keep_newest else 0))
        self._report(before, added=False)

    def _evict(self, max_bytes: int) -> None:
        head = self._head
        n = len(self._firsts)
        while self._bytes > max_bytes and head < n:
            self._bytes -= self._sizes[head]
            self._chunks[head] = ()
            head += 1
        self._head = head
        if head == n:
            self._reset(self._end)
        elif head > 1024 and head * 2 > n:
            del self._firsts[:head]
            del self._chunks[:head]
            del self._sizes[:head]
            self._head = 0

    def read(self, start: int, end: int, max_records: int, max_bytes: int) -> list[tuple[int, bytes]] | None:
        """Up to max_records records from `start` (< end), at most ~max_bytes of payload (always at least
        one record). None if `start` is not cached."""
        firsts = self._firsts
        head = self._head
        if head >= len(firsts) or start < firsts[head] or start >= self._end:
            return None
        end = min(end, self._end)
        i = bisect_right(firsts, start, lo=head) - 1
        out: list[tuple[int, bytes]] = []
        nbytes = 0
        offset = start
        n = len(firsts)
        while i < n and offset < end:
            chunk = self._chunks[i]
            j = offset - firsts[i]
            stop = min(len(chunk), j + (end - offset), j + (max_records - len(out)))
            while j < stop:
                payload = chunk[j]
                nbytes += len(payload)
                if out and nbytes > max_bytes:
                    return out
                out.append((offset, payload))
                offset += 1
                j += 1
            if len(out) >= max_records:
                break
            i += 1
        return out
