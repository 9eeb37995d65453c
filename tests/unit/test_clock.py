"""`ister.clock`: the virtual clock that tests of timeouts run on, and the real one."""

from __future__ import annotations

import asyncio

import pytest

from ister.clock import REAL_CLOCK, VirtualClock


async def test_advancing_runs_what_is_due_in_order_of_time_then_of_scheduling() -> None:
    clock = VirtualClock()
    ran: list[tuple[str, float]] = []
    for name, delay in (("c", 3.0), ("a", 1.0), ("b1", 2.0), ("b2", 2.0), ("late", 9.0)):
        clock.call_later(delay, lambda n=name: ran.append((n, clock.monotonic())))
    cancelled = clock.call_later(1.5, lambda: ran.append(("x", 0.0)))
    cancelled.cancel()
    await clock.advance(5.0)
    assert ran == [("a", 1.0), ("b1", 2.0), ("b2", 2.0), ("c", 3.0)]
    assert clock.monotonic() == 5.0 and clock.pending() == 1 and clock.next_due() == 9.0


async def test_a_sleeping_task_wakes_at_its_time_and_runs_on() -> None:
    clock = VirtualClock(wall_start=1000.0)
    steps: list[float] = []

    async def ticker() -> None:
        for _ in range(3):
            await clock.sleep(0.5)
            steps.append(clock.monotonic())

    task = asyncio.ensure_future(ticker())
    await clock.advance(1.2)
    assert steps == [0.5, 1.0] and not task.done()
    await clock.advance(0.3)
    assert steps == [0.5, 1.0, 1.5] and task.done()
    assert clock.time() == 1001.5


async def test_a_timeout_expires_in_virtual_time_only() -> None:
    clock = VirtualClock()
    never = asyncio.Event()

    async def waits() -> str:
        try:
            async with clock.timeout(2.0):
                await never.wait()
        except TimeoutError:
            return f"timed out at {clock.monotonic()}"
        return "done"

    task = asyncio.ensure_future(waits())
    await clock.advance(1.9)
    assert not task.done()
    await clock.advance(0.1)
    assert await task == "timed out at 2.0"


async def test_a_block_done_in_time_keeps_no_timer() -> None:
    clock = VirtualClock()
    async with clock.timeout(5.0):
        await asyncio.sleep(0)
    assert clock.pending() == 0
    async with clock.timeout(None):
        pass


async def test_what_is_due_at_once_runs_without_advancing() -> None:
    clock = VirtualClock()
    ran: list[int] = []
    clock.call_later(0, lambda: ran.append(1))
    await clock.sleep(0)
    await asyncio.sleep(0)
    assert ran == [1]
    with pytest.raises(ValueError):
        await clock.advance(-1)


async def test_the_real_clock() -> None:
    before = REAL_CLOCK.monotonic()
    fired = asyncio.Event()
    REAL_CLOCK.call_later(0.01, fired.set)
    await asyncio.wait_for(fired.wait(), 5)
    await REAL_CLOCK.sleep(0)
    with pytest.raises(TimeoutError):
        async with REAL_CLOCK.timeout(0.01):
            await asyncio.Event().wait()
    assert REAL_CLOCK.monotonic() > before and REAL_CLOCK.time() > 1e9
