"""`FrameTail`: the WAL frames of the latest committed appends, byte for byte as the writer wrote them.

A replicated topic's leader ships these to its followers as they are (`IsterReplica.Replicate`'s `frames`),
so neither side encodes or decodes a frame per record. One entry per append call, as in `RecordCache`;
event-loop thread only. Bounded by bytes, and trimmed below what every follower stream has been sent.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FrameRun:
    """`count` consecutive frames from offset `first`, as `blobs` (whole appends) of `nbytes` in all."""

    first: int
    count: int
    blobs: list[bytes]
    nbytes: int

    @property
    def end(self) -> int:
        return self.first + self.count


class FrameTail:
    __slots__ = ("_bytes", "_end", "_firsts", "_frames", "_head", "max_bytes")

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        # One entry per append: its first offset and its frames (lists compacted lazily from `_head`).
        self._firsts: list[int] = []
        self._frames: list[bytes] = []
        self._head = 0
        self._end = 0
        self._bytes = 0

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._firsts) - self._head

    @property
    def first_offset(self) -> int | None:
        return self._firsts[self._head] if len(self) else None

    @property
    def end_offset(self) -> int | None:
        return self._end if len(self) else None

    def add(self, first: int, count: int, frames: bytes) -> None:
        """An append became durable; one that does not continue the tail starts it afresh."""
        if len(self) and self._end != first:
            self.clear()
        self._firsts.append(first)
        self._frames.append(frames)
        self._end = first + count
        self._bytes += len(frames)
        if self._bytes > self.max_bytes:
            self._drop_head(lambda i: len(self) > 1 and self._bytes > self.max_bytes)

    def trim(self, below: int) -> None:
        """Forget the appends wholly below `below` (every reader is past them)."""
        self._drop_head(lambda i: self._next_first(i) <= below)

    def _next_first(self, i: int) -> int:
        return self._firsts[i + 1] if i + 1 < len(self._firsts) else self._end

    def _drop_head(self, drop: Callable[[int], bool]) -> None:
        head, n = self._head, len(self._firsts)
        while head < n and drop(head):
            self._bytes -= len(self._frames[head])
            self._frames[head] = b""
            head += 1
            self._head = head
        if head == n:
            self.clear()
        elif head > 1024 and head * 2 > n:
            del self._firsts[:head]
            del self._frames[:head]
            self._head = 0

    def truncate(self, end: int) -> None:
        """Forget every append that reaches `end` or beyond (the log was cut there)."""
        while len(self) and self._end > end:
            self._end = self._firsts.pop()
            self._bytes -= len(self._frames.pop())
        if not len(self):
            self.clear()

    def clear(self) -> None:
        self._firsts.clear()
        self._frames.clear()
        self._head = 0
        self._end = 0
        self._bytes = 0

    def take(self, start: int, end: int, max_records: int, max_bytes: int) -> FrameRun | None:
        """Whole appends from `start` (which must begin one) up to `end`, at most `max_records` records and
        about `max_bytes` (at least one append); None when the tail cannot serve `start` that way."""
        firsts = self._firsts
        head = self._head
        if not len(self) or start < firsts[head] or start >= self._end:
            return None
        i = bisect_left(firsts, start, lo=head)
        if i == len(firsts) or firsts[i] != start:
            return None
        blobs: list[bytes] = []
        nbytes = 0
        at = start
        n = len(firsts)
        while i < n:
            after = self._next_first(i)
            frames = self._frames[i]
            if after > end or after - start > max_records or (blobs and nbytes + len(frames) > max_bytes):
                break
            blobs.append(frames)
            nbytes += len(frames)
            at = after
            i += 1
        if not blobs:
            return None
        return FrameRun(start, at - start, blobs, nbytes)
