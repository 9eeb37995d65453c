"""Deadlines (broker/deadlines.py): the publish path's cheap replacement for asyncio.timeout.

Time is virtual (`VirtualClock`) except where real event loops' timers are the point."""

from __future__ import annotations

import asyncio

import pytest

from ister.broker.deadlines import Deadlines
from ister.clock import VirtualClock


async def _wait_forever(deadlines: Deadlines) -> None:
    with deadlines.guard():
        await asyncio.sleep(5)  # "for ever": long enough to fail the test, not to hang it


async def test_a_block_that_ends_in_time_is_left_alone() -> None:
    clock = VirtualClock()
    deadlines = Deadlines(0.05, clock)
    with deadlines.guard():
        await asyncio.sleep(0)
    assert len(deadlines) == 0
    await clock.advance(0.1)  # past the deadline the block had: nothing is cancelled later
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


async def test_a_block_that_waits_too_long_gets_timeout_error_not_before_its_deadline() -> None:
    clock = VirtualClock()
    deadlines = Deadlines(0.05, clock)
    started = clock.monotonic()
    advancing = asyncio.create_task(clock.advance(1.0))
    with pytest.raises(TimeoutError):
        await _wait_forever(deadlines)
    assert clock.monotonic() - started >= 0.05
    await advancing
    assert len(deadlines) == 0
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0  # its cancellation was taken back


async def test_each_waiter_expires_at_its_own_deadline_and_early_leavers_are_not_cancelled() -> None:
    clock = VirtualClock()
    deadlines = Deadlines(0.2, clock)
    ended: dict[str, float] = {}

    async def waiter(name: str, release: asyncio.Event | None) -> str:
        started = clock.monotonic()
        try:
            with deadlines.guard():
                await (release or asyncio.Event()).wait()
            return "released"
        except TimeoutError:
            ended[name] = clock.monotonic() - started
            return "timed out"

    release = asyncio.Event()
    first = asyncio.create_task(waiter("first", release))  # the oldest: the timer is armed for it
    await clock.advance(0.05)
    second = asyncio.create_task(waiter("second", None))
    await clock.advance(0.05)
    third = asyncio.create_task(waiter("third", None))
    await asyncio.sleep(0)
    release.set()  # the oldest leaves in time: the timer must move on to the next
    assert await first == "released"
    await clock.advance(0.25)  # past the deadlines of the second and the third
    # bounded: a timer that never moves on would leave them waiting for ever
    assert await asyncio.wait_for(second, 5) == "timed out"
    assert await asyncio.wait_for(third, 5) == "timed out"
    assert ended["second"] >= 0.2 and ended["third"] >= 0.2
    assert len(deadlines) == 0


async def test_waiters_after_an_idle_spell_still_expire() -> None:
    clock = VirtualClock()
    deadlines = Deadlines(0.05, clock)
    with deadlines.guard():
        await asyncio.sleep(0)
    await clock.advance(0.1)  # the timer armed for that block fired and found nothing
    advancing = asyncio.create_task(clock.advance(1.0))
    with pytest.raises(TimeoutError):
        await _wait_forever(deadlines)
    await advancing
    with deadlines.guard():  # and again while its timer is still armed for a block that has left
        await asyncio.sleep(0)
    await clock.advance(0.01)  # a later deadline than that block's
    advancing = asyncio.create_task(clock.advance(1.0))
    with pytest.raises(TimeoutError):
        await _wait_forever(deadlines)
    await advancing


async def test_a_cancellation_from_elsewhere_stays_a_cancellation() -> None:
    deadlines = Deadlines(10.0)
    task = asyncio.create_task(_wait_forever(deadlines))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(deadlines) == 0


async def test_expired_and_cancelled_from_elsewhere_is_a_cancellation() -> None:
    clock = VirtualClock()
    deadlines = Deadlines(0.05, clock)
    entered = asyncio.Event()

    async def stubborn() -> None:
        with deadlines.guard():
            entered.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                await clock.sleep(0.05)  # still inside the block when the caller cancels it too
                raise

    task = asyncio.create_task(stubborn())
    await entered.wait()
    await clock.advance(0.07)  # the guard has cancelled it by now
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_bad_use_is_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        Deadlines(0)
    deadlines = Deadlines(1.0)
    loop = asyncio.get_running_loop()
    failures: list[BaseException] = []

    def outside_a_task() -> None:
        try:
            deadlines.guard()
        except RuntimeError as exc:
            failures.append(exc)

    loop.call_soon(outside_a_task)
    await asyncio.sleep(0.01)
    assert len(failures) == 1 and "task" in str(failures[0])


def test_one_deadlines_used_by_one_loop_after_another() -> None:
    # Real time: the point is real event loops' timers. A topic's Deadlines outlives nothing in the broker,
    # but tests run many loops: a timer left armed in a loop that has closed must not keep the next loop's
    # waiters from expiring.
    deadlines = Deadlines(0.05)

    async def leave_a_timer_armed() -> None:
        with deadlines.guard():
            await asyncio.sleep(0)

    async def wait_too_long() -> None:
        with pytest.raises(TimeoutError):
            await _wait_forever(deadlines)

    asyncio.run(leave_a_timer_armed())
    asyncio.run(wait_too_long())
