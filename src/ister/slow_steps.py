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
from collections.abc import Iterator

from ister.clock import REAL_CLOCK, Clock

log = logging.getLogger(__name__)

STACK_FRAMES = 12


def _report(what: str, task: asyncio.Task[object] | None, started: float, clock: Clock) -> None:
    where = ""
    if task is not None and not task.done():
        out = io.StringIO()
        task.print_stack(limit=STACK_FRAMES, file=out)
        where = "\n" + out.getvalue().rstrip()
    log.warning("%s has been running for %.1f s%s", what, clock.monotonic() - started, where)


@contextlib.contextmanager
def warn_if_slow(what: str, after_s: float, clock: Clock = REAL_CLOCK) -> Iterator[None]:
    """Log a WARNING (with the current task's stack) if the body is still running after `after_s`."""
    task, started = asyncio.current_task(), clock.monotonic()
    handle = clock.call_later(after_s, lambda: _report(what, task, started, clock))
    try:
        yield
    finally:
        handle.cancel()
