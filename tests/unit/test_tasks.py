"""`TaskSupervisor`: a component's background tasks have an owner that logs their failures and stops them."""

from __future__ import annotations

import asyncio
import logging

import pytest

from ister.tasks import TaskSupervisor


async def test_a_failure_is_logged_at_once_and_the_task_forgotten(caplog: pytest.LogCaptureFixture) -> None:
    tasks = TaskSupervisor("thing")

    async def fails() -> None:
        raise RuntimeError("boom")

    with caplog.at_level(logging.ERROR):
        task = tasks.spawn(fails(), "failing")
        await asyncio.wait([task])
        await asyncio.sleep(0)
    assert "thing: task failing failed" in caplog.text and "boom" in caplog.text
    assert len(tasks) == 0


async def test_on_error_replaces_the_log() -> None:
    seen: list[tuple[str, str]] = []
    tasks = TaskSupervisor("thing", on_error=lambda name, exc: seen.append((name, str(exc))))

    async def fails() -> None:
        raise ValueError("bad")

    await asyncio.wait([tasks.spawn(fails(), "f")])
    await asyncio.sleep(0)
    assert seen == [("f", "bad")]


async def test_close_cancels_and_awaits_what_runs_and_refuses_new_work() -> None:
    tasks = TaskSupervisor("thing")
    stopped: list[str] = []

    async def forever(name: str) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            stopped.append(name)

    a = tasks.spawn(forever("a"), "a")
    b = tasks.spawn(forever("b"), "b")
    await asyncio.sleep(0)
    await tasks.close()
    assert sorted(stopped) == ["a", "b"] and a.cancelled() and b.cancelled() and len(tasks) == 0
    coro = forever("c")
    with pytest.raises(RuntimeError, match="closed"):
        tasks.spawn(coro, "c")
    assert "c" not in stopped  # never ran


async def test_close_from_one_of_its_own_tasks_does_not_cancel_that_task() -> None:
    tasks = TaskSupervisor("thing")

    async def closer() -> str:
        await tasks.close()
        return "closed"

    assert await tasks.spawn(closer(), "closer") == "closed"
