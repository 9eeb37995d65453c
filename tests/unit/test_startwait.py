"""`ister.startwait.wait_for` in virtual time: the backoff between attempts, one log line per failure,
what `/readyz` is shown while waiting, the start timeout (and 0 = forever), and errors no retry can fix."""

from __future__ import annotations

import asyncio
import logging

import pytest

from ister.clock import VirtualClock
from ister.core.backoff import Backoff
from ister.errors import InvalidArgument, MetadataError, StartTimeout
from ister.startwait import Waiting, unless_stopped, wait_for
from tests.support import advance_until

BACKOFF = Backoff(first=0.5, cap=5.0, factor=2.0)  # no jitter: the waits are exact


class Flaky:
    """Fails (a retriable MetadataError) until `until` seconds of virtual time, then answers."""

    def __init__(self, clock: VirtualClock, until: float) -> None:
        self.clock = clock
        self.until = until
        self.calls: list[float] = []

    async def __call__(self) -> str:
        self.calls.append(self.clock.monotonic())
        if self.clock.monotonic() < self.until:
            raise MetadataError("cannot reach etcd at http://127.0.0.1:1: connection refused")
        return "store"


async def test_retries_with_backoff_logs_each_attempt_and_shows_what_it_waits_for(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = VirtualClock()
    attempt = Flaky(clock, until=10.0)
    shown: list[Waiting | None] = []
    caplog.set_level(logging.INFO, "ister.startwait")
    task = asyncio.create_task(
        wait_for(
            "etcd",
            "http://127.0.0.1:1",
            attempt,
            timeout=300,
            on_wait=shown.append,
            clock=clock,
            backoff=BACKOFF,
        )
    )
    await advance_until(clock, task.done, "etcd reached", step=0.25, limit=30)
    assert task.result() == "store"
    # 0.5, 1, 2, 4, then the cap of 5 s between attempts.
    assert attempt.calls == [0.0, 0.5, 1.5, 3.5, 7.5, 12.5]
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 5
    assert lines[0] == (
        "waiting for etcd at http://127.0.0.1:1: attempt 1 failed (cannot reach etcd at http://127.0.0.1:1: "
        "connection refused); next try in 0.5 s"
    )
    assert "attempt 5 failed" in lines[4] and "next try in 5.0 s" in lines[4]
    assert shown[-1] is None  # reached: nothing is waited for any more
    first = shown[0]
    assert first is not None and first.describe().startswith(
        "waiting for etcd at http://127.0.0.1:1 (attempt 1"
    )
    assert any(
        "reached etcd at http://127.0.0.1:1 after 6 attempts" in r.getMessage() for r in caplog.records
    )


async def test_the_start_timeout_ends_the_wait_with_a_clear_error() -> None:
    clock = VirtualClock()
    attempt = Flaky(clock, until=1e9)
    task = asyncio.create_task(
        wait_for("etcd", "http://127.0.0.1:1", attempt, timeout=8, clock=clock, backoff=BACKOFF)
    )
    await advance_until(clock, task.done, "the wait gave up", step=0.25, limit=30)
    with pytest.raises(StartTimeout) as err:
        task.result()
    assert str(err.value) == (
        "etcd at http://127.0.0.1:1 was not reached within the start timeout of 8 s (5 attempts; last error: "
        "cannot reach etcd at http://127.0.0.1:1: connection refused)"
    )
    assert clock.monotonic() <= 8.25  # not one backoff past the timeout: the last wait was cut to fit


async def test_an_attempt_that_hangs_is_cut_at_the_timeout() -> None:
    clock = VirtualClock()

    async def hangs() -> None:
        await clock.sleep(1e9)

    task = asyncio.create_task(wait_for("the object store", "s3://b", hangs, timeout=3, clock=clock))
    await advance_until(clock, task.done, "the wait gave up", step=0.5, limit=10)
    with pytest.raises(StartTimeout, match=r"the object store at s3://b was not reached within .* 3 s"):
        task.result()


async def test_zero_waits_forever() -> None:
    clock = VirtualClock()
    attempt = Flaky(clock, until=3600.0)
    task = asyncio.create_task(wait_for("etcd", "e", attempt, timeout=0, clock=clock, backoff=BACKOFF))
    await advance_until(clock, task.done, "etcd reached after an hour", step=5, limit=3700)
    assert task.result() == "store"


async def test_an_error_no_retry_can_fix_ends_the_wait_at_once() -> None:
    clock = VirtualClock()
    calls = 0

    async def refused() -> None:
        nonlocal calls
        calls += 1
        raise InvalidArgument("invalid etcd namespace 'x'")

    with pytest.raises(InvalidArgument):
        await wait_for("etcd", "e", refused, timeout=300, clock=clock)
    assert calls == 1


async def test_a_stop_while_waiting_ends_the_wait_cleanly() -> None:
    clock = VirtualClock()
    attempt = Flaky(clock, until=1e9)
    stop = asyncio.Event()
    task = asyncio.create_task(
        unless_stopped(wait_for("etcd", "e", attempt, timeout=0, clock=clock, backoff=BACKOFF), stop)
    )
    await clock.advance(2)
    stop.set()
    assert await task is None
