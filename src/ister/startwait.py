"""Waiting at start for what a broker depends on (etcd, the object store), instead of exiting.

An orchestrated start has no order: a broker may come up before etcd or the object store answers. Each
dependency's first reach is retried under a capped backoff (`core.backoff`), on the injected `Clock`, with
one log line per failed attempt (what, where, attempt n, why, next try in s) and the same words on
`/readyz` while it lasts (`on_wait`). `timeout` bounds the whole wait (0: wait forever); when it runs out
the broker stops with `StartTimeout`, naming what it waited for and the last error. Errors that a retry
cannot fix (`retriable` is False: a bad argument, refused credentials) end the wait at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from ister.clock import REAL_CLOCK, Clock
from ister.core.backoff import Backoff, Retries
from ister.errors import IsterError, StartTimeout

log = logging.getLogger(__name__)

T = TypeVar("T")

# 0.5 s, 1 s, 2 s, then every 5 s (less up to 20 % jitter, so brokers started together spread out).
START_BACKOFF = Backoff(first=0.5, cap=5.0, factor=2.0, jitter=0.2)
MAX_ERROR_CHARS = 300


@dataclass(frozen=True, slots=True)
class Waiting:
    """One dependency not reached yet: what `/readyz` shows while the broker waits."""

    what: str
    where: str
    attempt: int
    error: str
    next_try_seconds: float
    waited_seconds: float

    def describe(self) -> str:
        return (
            f"waiting for {self.what} at {self.where} (attempt {self.attempt} failed: {self.error}; "
            f"next try in {self.next_try_seconds:.1f} s, waiting {self.waited_seconds:.0f} s)"
        )


def _first_line(exc: BaseException) -> str:
    text = str(exc).split("\n", 1)[0] or type(exc).__name__
    return text[:MAX_ERROR_CHARS]


def _retriable(exc: BaseException) -> bool:
    return exc.retriable if isinstance(exc, IsterError) else isinstance(exc, OSError | TimeoutError)


async def wait_for(
    what: str,
    where: str,
    attempt: Callable[[], Awaitable[T]],
    *,
    timeout: float,  # noqa: ASYNC109  (the bound of the whole wait, 0 = none; attempts are bounded by it)
    on_wait: Callable[[Waiting | None], None] = lambda _: None,
    clock: Clock = REAL_CLOCK,
    backoff: Backoff = START_BACKOFF,
    draw: Callable[[], float] = random.random,
) -> T:
    """`attempt()`'s result once it succeeds; retried after each retriable failure."""
    start = clock.monotonic()
    retries = Retries(backoff, draw)
    last = "no attempt finished"
    made = 0
    while True:
        n = retries.failures + 1
        left = timeout - (clock.monotonic() - start) if timeout > 0 else None
        try:
            if left is not None and left <= 0:
                raise TimeoutError
            made += 1
            async with clock.timeout(left):
                result = await attempt()
        except TimeoutError as exc:
            if left is not None and clock.monotonic() - start >= timeout:
                raise StartTimeout(
                    f"{what} at {where} was not reached within the start timeout of {timeout:g} s "
                    f"({made} attempts; last error: {last})"
                ) from None
            error = _first_line(exc) if str(exc) else "timed out"
        except Exception as exc:
            if not _retriable(exc):
                raise
            error = _first_line(exc)
        else:
            if n > 1:
                waited = clock.monotonic() - start
                log.info("reached %s at %s after %d attempts (%.1f s)", what, where, n, waited)
            on_wait(None)
            return result
        last = error
        delay = retries.next()
        waited = clock.monotonic() - start
        if timeout > 0:
            delay = max(0.0, min(delay, timeout - waited))
        log.warning(
            "waiting for %s at %s: attempt %d failed (%s); next try in %.1f s", what, where, n, error, delay
        )
        on_wait(Waiting(what, where, n, error, delay, waited))
        await clock.sleep(delay)


async def unless_stopped(work: Awaitable[T], stop: asyncio.Event) -> T | None:
    """`work`'s result, or None when `stop` is set first (`work` is then cancelled): a broker told to stop
    while it still waits for a dependency exits cleanly."""
    task = asyncio.ensure_future(work)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return task.result() if not task.cancelled() else None
