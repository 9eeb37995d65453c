"""broker/stall_watch.py: a blocked event loop and a long garbage collection are reported with their cause."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time

from ister.broker.stall_watch import StallWatch
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
