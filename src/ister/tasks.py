"""`TaskSupervisor`: the owner of a component's background tasks.

Every long-lived task (and fire-and-forget work) a component starts goes through its supervisor, so none is
orphaned: a task that fails is logged at once (not when garbage collected, as "Task exception was never
retrieved"), a finished task is forgotten, and `close()` cancels whatever still runs and waits for it.
Where a task's lifetime is one block of code, `asyncio.TaskGroup` is the owner instead.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class TaskSupervisor:
    def __init__(self, owner: str, *, on_error: Callable[[str, BaseException], None] | None = None) -> None:
        self.owner = owner  # named in the log lines of its tasks' failures
        self._tasks: set[asyncio.Task[Any]] = set()
        self._on_error = on_error
        self._closed = False

    def spawn(self, coro: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
        """Run `coro` as a task owned here (refused once closed: the coroutine is closed unrun)."""
        if self._closed:
            coro.close()
            raise RuntimeError(f"{self.owner}: closed, cannot start {name}")
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()  # retrieved here, so asyncio never reports it as unretrieved
        if exc is None:
            return
        if self._on_error is not None:
            self._on_error(task.get_name(), exc)
        else:
            log.error("%s: task %s failed", self.owner, task.get_name(), exc_info=exc)

    @property
    def closed(self) -> bool:
        return self._closed

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self) -> Iterator[asyncio.Task[Any]]:
        """The tasks running now (a copy: safe to cancel them while iterating)."""
        return iter(list(self._tasks))

    async def close(self, grace: float | None = None) -> None:
        """Cancel every task still running and wait for them (at most `grace` seconds); none starts after."""
        self._closed = True
        current = asyncio.current_task()
        tasks = [t for t in self._tasks if not t.done() and t is not current]
        for task in tasks:
            task.cancel()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=grace)
            for task in pending:
                log.warning("%s: task %s did not stop within %s s", self.owner, task.get_name(), grace)
