"""When a reliable subscription persists its cursor: after CURSOR_FLUSH_ACKS acknowledgements or
CURSOR_FLUSH_SECONDS, whichever comes first, on close, and at once when a reset moves it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ister.clock import Clock
from ister.limits import CURSOR_FLUSH_ACKS, CURSOR_FLUSH_SECONDS

CursorWriter = Callable[[int], Awaitable[None]]


class CursorFlush:
    """One subscription's persisted cursor and what was acknowledged since it was written."""

    def __init__(self, write: CursorWriter, clock: Clock) -> None:
        self._write = write
        self._clock = clock
        self.persisted: int | None = None
        self.acks = 0  # acknowledged since the last write
        self._last = clock.monotonic()

    def acked(self, count: int) -> None:
        self.acks += count

    async def flush(self, cursor: int | None, force: bool = False) -> None:
        """Write `cursor` when it moved and a write is due (`force`: whenever it moved)."""
        if cursor is None or cursor == self.persisted:
            return
        due = (
            force
            or self.acks >= CURSOR_FLUSH_ACKS
            or self._clock.monotonic() - self._last >= CURSOR_FLUSH_SECONDS
        )
        if not due:
            return
        await self._write(cursor)
        self.persisted = cursor
        self.acks = 0
        self._last = self._clock.monotonic()

    async def moved(self, cursor: int) -> None:
        """A reset moved the cursor: write it now. On failure the error is raised, and the next flush writes
        the cursor then current (this one may have been written)."""
        try:
            await self._write(cursor)
        except BaseException:
            self.persisted = None
            raise
        self.persisted = cursor
        self.acks = 0
