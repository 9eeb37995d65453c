"""`warn_if_slow`: a warning with the waiting task's stack for a step past its time, none for a quick one."""

from __future__ import annotations

import asyncio
import logging

import pytest

from ister.clock import VirtualClock
from ister.slow_steps import warn_if_slow


async def waits_on(event: asyncio.Event) -> None:
    await event.wait()


async def test_a_step_past_its_time_is_reported_with_where_it_waits(caplog: pytest.LogCaptureFixture) -> None:
    event = asyncio.Event()
    clock = VirtualClock()
    with caplog.at_level(logging.WARNING, logger="ister.slow_steps"):

        async def step() -> None:
            with warn_if_slow("loading assigned topic /default/t", 0.05, clock):
                await waits_on(event)

        task = asyncio.create_task(step())
        await clock.advance(0.05)  # its time is up while it waits
        event.set()
        await task
    (record,) = caplog.records
    text = record.getMessage()
    assert "loading assigned topic /default/t has been running for" in text
    assert "waits_on" in text  # the stack shows where it waits


async def test_a_quick_step_is_not_reported(caplog: pytest.LogCaptureFixture) -> None:
    clock = VirtualClock()
    with caplog.at_level(logging.WARNING, logger="ister.slow_steps"):
        with warn_if_slow("a quick step", 0.05, clock):
            await asyncio.sleep(0)
        await clock.advance(0.15)  # past the deadline: the cancelled timer stays silent
    assert caplog.records == []
