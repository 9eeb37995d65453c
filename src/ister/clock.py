"""`Clock`: the time the runtime reads and waits on, given to the parts that keep timeouts and schedules.

`core/` takes time as arguments; the asyncio parts around it take a `Clock` instead of reading
`time.monotonic` and sleeping on the loop themselves, so their tests run in virtual time: `VirtualClock`
moves only when a test advances it, and running what falls due is deterministic (in order of due time,
ties in the order they were scheduled), each callback followed by turns of the event loop.

Timers and sleeps of a `VirtualClock` are driven by `advance`; what is due at once (a delay of zero or less)
runs on the loop's next turn, as with the real clock, so code that polls without waiting is unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Protocol

SETTLE_TURNS = 20  # event-loop turns after each callback a VirtualClock runs (a few awaits deep)


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (durations, deadlines)."""
        ...

    def time(self) -> float:
        """Wall-clock seconds since the epoch (timestamps others read)."""
        ...

    async def sleep(self, seconds: float) -> None: ...

    def call_later(self, delay: float, callback: Callable[[], object]) -> Timer:
        """Run `callback` on the running loop after `delay` seconds (cancel() the result to not)."""
        ...

    def timeout(self, delay: float | None) -> AbstractAsyncContextManager[object]:
        """`asyncio.timeout` on this clock: TimeoutError when the block is not done within `delay`."""
        ...


class RealClock:
    """The process's clocks and the event loop's timers."""

    __slots__ = ()

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def call_later(self, delay: float, callback: Callable[[], object]) -> Timer:
        return asyncio.get_running_loop().call_later(max(0.0, delay), callback)

    def timeout(self, delay: float | None) -> AbstractAsyncContextManager[object]:
        return asyncio.timeout(delay)


REAL_CLOCK: Clock = RealClock()


class _VirtualTimer:
    __slots__ = ("callback", "cancelled", "seq", "when")

    def __init__(self, when: float, seq: int, callback: Callable[[], object]) -> None:
        self.when = when
        self.seq = seq
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    def __lt__(self, other: _VirtualTimer) -> bool:
        return (self.when, self.seq) < (other.when, other.seq)


class VirtualClock:
    """A clock for tests that moves only by `advance`. Wall time starts at `wall_start` and moves with
    monotonic time, or only by `step_wall` when `wall_moves` is False (a test of wall-clock rules)."""

    def __init__(
        self, start: float = 0.0, wall_start: float = 1_700_000_000.0, *, wall_moves: bool = True
    ) -> None:
        self._now = start
        self._start = start
        self._wall_moves = wall_moves
        self._wall_offset = wall_start - start
        self._timers: list[_VirtualTimer] = []
        self._seq = itertools.count()

    def monotonic(self) -> float:
        return self._now

    def time(self) -> float:
        return (self._now if self._wall_moves else self._start) + self._wall_offset

    def call_later(self, delay: float, callback: Callable[[], object]) -> Timer:
        if delay <= 0:  # due now: the loop's next turn, as on the real clock
            return asyncio.get_running_loop().call_soon(callback)
        timer = _VirtualTimer(self._now + delay, next(self._seq), callback)
        heapq.heappush(self._timers, timer)
        return timer

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not future.done():
                future.set_result(None)

        timer = self.call_later(seconds, wake)
        try:
            await future
        finally:
            timer.cancel()

    def timeout(self, delay: float | None) -> AbstractAsyncContextManager[object]:
        return self._timeout(delay)

    @contextlib.asynccontextmanager
    async def _timeout(self, delay: float | None) -> AsyncIterator[object]:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(None) as scope:
            timer = None
            if delay is not None:
                # Expires the real scope at once when virtual time reaches the deadline.
                timer = self.call_later(delay, lambda: scope.reschedule(loop.time()))
            try:
                yield scope
            finally:
                if timer is not None:
                    timer.cancel()

    def step_wall(self, seconds: float) -> None:
        """The wall clock is set forward (or back, when negative) by `seconds`; monotonic time stays."""
        self._wall_offset += seconds

    def pending(self) -> int:
        """Timers and sleeps waiting for virtual time to reach them."""
        return sum(1 for t in self._timers if not t.cancelled)

    def next_due(self) -> float | None:
        """When the earliest pending timer is due (None: none)."""
        while self._timers and self._timers[0].cancelled:
            heapq.heappop(self._timers)
        return self._timers[0].when if self._timers else None

    async def advance(self, seconds: float) -> None:
        """Move time forward by `seconds`, running each timer that falls due at its own time, in order,
        with turns of the loop after each (so a task it wakes runs up to its next wait)."""
        if seconds < 0:
            raise ValueError("virtual time never goes back")
        target = self._now + seconds
        await settle()
        while (due := self.next_due()) is not None and due <= target:
            timer = heapq.heappop(self._timers)
            self._now = max(self._now, timer.when)
            timer.callback()
            await settle()
        self._now = target
        await settle()


async def settle(turns: int = SETTLE_TURNS) -> None:
    """Give the event loop `turns` turns (tasks woken run on to their next wait unless that is real I/O)."""
    for _ in range(turns):
        await asyncio.sleep(0)
