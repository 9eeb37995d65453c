"""Notice when the event loop stops answering, and say where it was.

Every request of the broker is served on one event loop, so anything that holds it (a long Python step, a
blocking call, a garbage collection) delays every client at once; such pauses are rare and short, which
makes them hard to pin on a cause after the fact. A heartbeat task on the loop stamps the time every
BEAT_SECONDS; a daemon thread checks the stamp. When the loop has not beaten for `threshold` seconds the
thread takes the loop thread's Python stack (`sys._current_frames`), and once the loop runs again logs one
line at WARNING with the pause's length and the innermost frame, and the stack at DEBUG. Under CPU load
pauses come in bursts: at most one WARNING per `LOG_EVERY_SECONDS` (each kind), the next one saying how
many were not logged meanwhile (every one is counted in the metrics and kept in `stalls`). A collection
by CPython's cyclic garbage collector longer than `threshold` is logged on its own (with its generation):
it holds the GIL, so the thread cannot look while it runs. Both are counted in metrics
(`ister_event_loop_stalls_total`, `ister_gc_pauses_total`).

What it costs: one timer callback on the loop and one thread wake-up every BEAT_SECONDS, and a callback
per garbage collection (two clock reads).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import threading
import time
import traceback
from typing import Any

from prometheus_client import Counter

log = logging.getLogger(__name__)

BEAT_SECONDS = 0.02
STALL_THRESHOLD_SECONDS = 0.1
STACK_LINES = 12  # innermost frames logged (at DEBUG)
JOIN_SECONDS = 1.0  # bound on `close()` waiting for the thread
LOG_EVERY_SECONDS = 30.0  # at most one WARNING per this long for stalls, and one for GC pauses

LOOP_STALLS = Counter(
    "ister_event_loop_stalls", f"Times the event loop did not run for {STALL_THRESHOLD_SECONDS} s or more"
)
GC_PAUSES = Counter(
    "ister_gc_pauses", f"Garbage collections that held the interpreter {STALL_THRESHOLD_SECONDS} s or more"
)


class StallWatch:
    """`await run()` as a task of the broker's loop; `close()` (or cancelling it) stops the thread."""

    def __init__(
        self, threshold: float = STALL_THRESHOLD_SECONDS, log_every: float = LOG_EVERY_SECONDS
    ) -> None:
        self.threshold = threshold
        self._stall_log = _RateLimit(log_every)
        self._gc_log = _RateLimit(log_every)
        self.stalls: list[tuple[float, str]] = []  # (seconds, stack) of the last few, newest last
        self.gc_pauses: list[tuple[int, float]] = []  # (generation, seconds) of the last few
        self._beat = time.monotonic()
        self._loop_thread = threading.get_ident()
        self._stop = threading.Event()
        self._gc_started = 0.0
        self._thread: threading.Thread | None = None

    @property
    def last_beat(self) -> float:
        """time.monotonic() of the loop's last heartbeat (liveness, broker/health.py)."""
        return self._beat

    async def run(self) -> None:
        self._loop_thread = threading.get_ident()
        self._beat = time.monotonic()
        gc.callbacks.append(self._on_gc)
        self._thread = threading.Thread(target=self._watch, name="ister-stall-watch", daemon=True)
        self._thread.start()
        try:
            while True:
                self._beat = time.monotonic()
                await asyncio.sleep(BEAT_SECONDS)
        finally:
            self.close()

    def close(self) -> None:
        """Stop the thread and wait for it (it wakes every BEAT_SECONDS): left running, it could read the
        loop thread's frames while the interpreter shuts down (seen: a traceback in the thread after
        "stopped", then the broker died of SIGSEGV)."""
        self._stop.set()
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(JOIN_SECONDS)

    def _watch(self) -> None:
        stalled_since: float | None = None  # the last beat before the pause being watched
        stack = ""
        while not self._stop.wait(BEAT_SECONDS):
            beat = self._beat
            if stalled_since is not None and beat != stalled_since:  # the loop ran again: report the pause
                self._report(beat - stalled_since - BEAT_SECONDS, stack)
                stalled_since = None
            if stalled_since is None and time.monotonic() - beat >= self.threshold + BEAT_SECONDS:
                stalled_since = beat
                stack = self._loop_stack()

    def _loop_stack(self) -> str:
        frame = sys._current_frames().get(self._loop_thread)
        if frame is None:
            return "(no Python frame)"
        return "".join(traceback.format_stack(frame)[-STACK_LINES:]).rstrip()

    def _report(self, seconds: float, stack: str) -> None:
        LOOP_STALLS.inc()
        self.stalls = [*self.stalls[-9:], (seconds, stack)]
        log.debug("the event loop did not run for %.0f ms; it was at:\n%s", seconds * 1e3, stack)
        skipped = self._stall_log.allow()
        if skipped is None:
            return
        log.warning(
            "the event loop did not run for %.0f ms (at %s)%s; the stack is logged at DEBUG",
            seconds * 1e3,
            _innermost(stack),
            _since(skipped, self._stall_log.every),
        )

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
            return
        seconds = time.perf_counter() - self._gc_started
        if seconds >= self.threshold:
            GC_PAUSES.inc()
            generation = int(info.get("generation", -1))
            self.gc_pauses = [*self.gc_pauses[-9:], (generation, seconds)]
            skipped = self._gc_log.allow()
            if skipped is None:
                return
            log.warning(
                "a garbage collection (generation %d, %d objects freed) held the interpreter for %.0f ms%s",
                generation,
                int(info.get("collected", 0)),
                seconds * 1e3,
                _since(skipped, self._gc_log.every),
            )


class _RateLimit:
    """At most one event per `every` seconds gets through; `allow()` is None for the others, else how
    many were held back since the last one that got through."""

    def __init__(self, every: float) -> None:
        self.every = every
        self._last: float | None = None
        self._held = 0

    def allow(self) -> int | None:
        now = time.monotonic()
        if self._last is not None and now - self._last < self.every:
            self._held += 1
            return None
        self._last = now
        held, self._held = self._held, 0
        return held


def _innermost(stack: str) -> str:
    """`file:line in function` of the innermost frame of a formatted stack."""
    for line in reversed(stack.splitlines()):
        text = line.strip()
        if text.startswith('File "'):
            path, _, rest = text[len('File "') :].partition('", line ')
            number, _, function = rest.partition(", in ")
            return f"{path.rsplit('/', 1)[-1]}:{number} in {function}"
    return stack.strip().splitlines()[-1] if stack.strip() else "?"


def _since(held: int, every: float) -> str:
    return f" ({held} more not logged in the last {every:g} s)" if held else ""
