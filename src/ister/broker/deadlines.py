"""Deadlines for awaits that almost never reach them, such as a publish waiting until its records are durable.

`asyncio.timeout` arms a loop timer and cancels it again on every use: ~4.6 µs on this machine, a few
percent of the event loop's time per Danube publish (one unary call per message). Here the waiting tasks
sit in a dict in the order they started; with one timeout per `Deadlines` that is also the order of their
deadlines, so a single timer per `Deadlines`, armed for the oldest waiter only while something waits, finds
the expired ones at the front. Entering and leaving a guard is a dict insert and delete. `shared` gives
every user of one timeout the same `Deadlines` (the publishes of all a broker's topics: one timer).

Time is the injected `Clock`'s (`REAL_CLOCK` by default; tests give a `VirtualClock`).

An expired guard cancels its task and, as `asyncio.timeout` does, turns that cancellation into TimeoutError
where the guarded block ends; a cancellation from elsewhere stays a cancellation.
"""

from __future__ import annotations

import asyncio
from functools import partial
from types import TracebackType

from ister.clock import REAL_CLOCK, Clock, Timer

# A timer re-armed for `deadline - now` may fire a rounding error before `deadline`: it counts as due.
_SLACK = 1e-6


class Deadlines:
    """Guards that give their block `timeout` seconds (on `clock`)."""

    __slots__ = ("_clock", "_timer", "_timer_loop", "_waiting", "timeout")

    def __init__(self, timeout: float, clock: Clock = REAL_CLOCK) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, not {timeout}")
        self.timeout = timeout
        self._clock = clock
        self._waiting: dict[DeadlineGuard, None] = {}  # insertion order = deadline order
        self._timer: Timer | None = None
        self._timer_loop: asyncio.AbstractEventLoop | None = None

    def guard(self) -> DeadlineGuard:
        """A guard for the current task (`with deadlines.guard(): await ...`)."""
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a deadline guard needs a running task")
        return DeadlineGuard(self, task)

    def __len__(self) -> int:
        return len(self._waiting)

    def _enter(self, guard: DeadlineGuard, loop: asyncio.AbstractEventLoop) -> None:
        guard.deadline = self._clock.monotonic() + self.timeout
        self._waiting[guard] = None
        if self._timer is None or self._timer_loop is not loop:  # (a closed loop's timer never fires)
            self._timer = self._clock.call_later(self.timeout, partial(self._expire, loop))
            self._timer_loop = loop

    def _leave(self, guard: DeadlineGuard) -> None:
        self._waiting.pop(guard, None)
        # The timer stays armed: when it fires it finds the waiter then oldest (or nothing) and moves on.

    def _expire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        now = self._clock.monotonic()
        expired = []
        for guard in self._waiting:
            if guard.deadline > now + _SLACK:
                break
            expired.append(guard)
        for guard in expired:
            del self._waiting[guard]
            if guard.task.get_loop() is loop:  # (not a task of a loop since closed)
                guard.expired = True
                guard.task.cancel()
        if self._waiting:
            oldest = next(iter(self._waiting))
            self._timer = self._clock.call_later(oldest.deadline - now, partial(self._expire, loop))
            self._timer_loop = loop


class DeadlineGuard:
    __slots__ = ("_cancelling", "_owner", "deadline", "expired", "task")

    def __init__(self, owner: Deadlines, task: asyncio.Task[object]) -> None:
        self._owner = owner
        self.task = task
        self.deadline = 0.0
        self.expired = False
        self._cancelling = 0

    def __enter__(self) -> DeadlineGuard:
        self._cancelling = self.task.cancelling()
        self._owner._enter(self, self.task.get_loop())
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self.expired:
            self._owner._leave(self)
            return
        # This guard cancelled the task: take its cancellation back; if nobody else cancelled the task too,
        # the block ran out of time.
        if self.task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc


_shared: dict[float, Deadlines] = {}


def shared(timeout: float) -> Deadlines:
    """The process's `Deadlines` for `timeout` (made on first use)."""
    deadlines = _shared.get(timeout)
    if deadlines is None:
        deadlines = _shared[timeout] = Deadlines(timeout)
    return deadlines
