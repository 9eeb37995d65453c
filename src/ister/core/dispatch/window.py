"""The subscription cursor: the highest offset below which everything is acknowledged or resolved.

Offsets acknowledged out of order wait in a set until the gap below them closes. The cursor never moves
backwards and never passes an offset that is still unresolved (DESIGN §2 invariant 4).
"""

from __future__ import annotations


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
