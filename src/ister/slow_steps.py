"""A warning, with where it waits, for an awaited step that takes far longer than it should.

Some cluster steps (loading an assigned topic: fencing, follower shutdown, compare-and-sets in etcd) are
retried by their callers but never run twice at once, so one that hangs blocks its topic silently. Wrap
such a step in `warn_if_slow`: past `after_s` it logs one WARNING with the awaiting task's stack; nothing
is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import time
from collections.abc import Iterator

log = logging.getLogger(__name__)

STACK_FRAMES = 12


def _report(what: str, task: asyncio.Task[object] | None, started: float) -> None:
    where = ""
    if task is not None and not task.done():
        out = io.StringIO()
        task.print_stack(limit=STACK_FRAMES, file=out)
        where = "\n" + out.getvalue().rstrip()
    log.warning("%s has been running for %.1f s%s", what, time.monotonic() - started, where)


@contextlib.contextmanager
def warn_if_slow(what: str, after_s: float) -> Iterator[None]:
    """Log a WARNING (with the current task's stack) if the body is still running after `after_s`."""
    loop = asyncio.get_running_loop()
    handle = loop.call_later(after_s, _report, what, asyncio.current_task(), time.monotonic())
    try:
        yield
    finally:
        handle.cancel()
