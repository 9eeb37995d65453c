"""broker/stall_watch.py: a blocked event loop and a long garbage collection are reported with their cause."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time

import pytest

from ister.broker.stall_watch import StallWatch, _RateLimit
from tests.support import until


def block_the_loop_for(seconds: float) -> None:
    time.sleep(seconds)  # a blocking call on the event loop: what the watch is for


async def test_a_blocked_loop_is_reported_with_its_length_and_stack() -> None:
    watch = StallWatch(threshold=0.25)  # well above a busy machine's hiccups
    task = asyncio.get_running_loop().create_task(watch.run())
    try:
        await asyncio.sleep(0.1)  # the watch thread is running
        block_the_loop_for(0.05)  # shorter than the threshold: not a stall
        await asyncio.sleep(0.2)
        assert watch.stalls == []
        block_the_loop_for(0.6)
        await until(lambda: watch.stalls, "the stall reported")
        (seconds, stack), *_ = watch.stalls
        assert 0.5 <= seconds <= 1.5
        assert "block_the_loop_for" in stack and "time.sleep" in stack
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert watch._on_gc not in gc.callbacks  # stopped: the collector no longer calls it
    assert watch._thread is not None and not watch._thread.is_alive()  # joined: gone before shutdown


async def test_a_long_garbage_collection_is_reported_with_its_generation() -> None:
    watch = StallWatch(threshold=0.0)  # every collection counts as long here
    task = asyncio.get_running_loop().create_task(watch.run())
    try:
        await asyncio.sleep(0)
        gc.collect(2)
        assert any(generation == 2 for generation, _ in watch.gc_pauses)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_stall_is_one_warning_line_with_the_stack_at_debug_and_rate_limited(
    caplog: pytest.LogCaptureFixture,
) -> None:
    watch = StallWatch(threshold=0.25, log_every=3600.0)
    task = asyncio.get_running_loop().create_task(watch.run())
    caplog.set_level(logging.DEBUG, logger="ister.broker.stall_watch")
    try:
        await asyncio.sleep(0.1)
        block_the_loop_for(0.5)
        await until(lambda: len(watch.stalls) == 1, "the first stall reported")
        block_the_loop_for(0.5)
        await until(lambda: len(watch.stalls) == 2, "the second stall reported")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert len(warnings) == 1, warnings  # the second stall falls in the same minute: not logged again
    assert "\n" not in warnings[0] and "in block_the_loop_for" in warnings[0], warnings[0]
    assert len(debug) == 2 and all("time.sleep" in d for d in debug)  # the stacks, at DEBUG


def test_the_rate_limit_counts_what_it_held_back() -> None:
    limit = _RateLimit(every=0.0)
    assert limit.allow() == 0 and limit.allow() == 0
    limit = _RateLimit(every=3600.0)
    assert limit.allow() == 0
    assert limit.allow() is None and limit.allow() is None
    limit._last = time.monotonic() - 7200  # two hours ago, as far as the limit knows
    assert limit.allow() == 2
