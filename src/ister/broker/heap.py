"""Short garbage-collector pauses with a large long-lived heap (many loaded topics).

CPython's cyclic collector walks every tracked object in a full (generation 2) collection, and runs one
each time the long-lived objects grew by a quarter. A broker with 100,000 topics tracks millions of
objects (about 70 per reliable topic), so a full collection would stop the event loop for a second while
topics are being loaded. The broker therefore moves the objects that live through a collection into
CPython's permanent generation (`gc.freeze()`) after every FREEZE_AFTER growth events: a topic loaded
or a segment piece exported (each leaves a few dozen long-lived objects behind; nothing is looked at
otherwise): later collections only walk what is newer, so their pauses stay in the milliseconds
whatever the topic count. The collection before each freeze walks everything made since the last one,
so it is kept small (checked every CHECK_SECONDS, after a few dozen events): with 200 topics and 2 s
between freezes it took 15-25 ms while topics were created at ~200/s, up to 170 ms on a loaded machine.

The youngest generation is collected every YOUNG_THRESHOLD allocations instead of CPython's 700: fewer
records of batches in flight are promoted and walked again and again (with 1,000 topics written at once
that took a sixth of the event loop's time), while one young collection, which frees the cyclic garbage
of the requests since the last (thousands of objects while topics are being created), stays a few ms.
The counts are net (allocations less deallocations), so where objects pile up rather than churn, a
collection of the middle generation walks up to YOUNG_THRESHOLD x (MIDDLE_THRESHOLD + 2) objects: with
20 (tried first) that was ~290,000 objects and a 190-220 ms pause while 20,000 topics exported their
segments; with 2, at most ~40,000 objects, a few tens of ms on a slow machine.

Frozen objects are still freed by reference counting; only a reference cycle among them is never
collected. Closing a topic breaks the cycles it knows of, and after many unloads (at least 1,000, and a
tenth of the growth count) a full collection unfreezes and sweeps everything once, a pause of
about 0.1 s per million objects, logged with its length.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

CHECK_SECONDS = 0.5
FREEZE_AFTER = 50  # growth events (topics loaded, segment pieces exported) since the last freeze
SWEEP_AFTER_UNLOADS = 1_000
YOUNG_THRESHOLD = 10_000  # allocations between two collections of the youngest generation
MIDDLE_THRESHOLD = 2  # young collections before the middle generation is collected with them


class HeapKeeper:
    """Run `run()` as a task in the broker process (not in tests: freezing affects the whole process).

    `counts` returns (growth: topics loaded now + segment pieces exported so far, topics unloaded so
    far)."""

    def __init__(self, counts: Callable[[], tuple[int, int]]) -> None:
        self._counts = counts
        self._unloaded_at_sweep = 0
        self._grown_at_freeze = 0
        self.freezes = 0
        self.sweeps = 0

    async def run(self) -> None:
        _, _, old = gc.get_threshold()
        gc.set_threshold(YOUNG_THRESHOLD, MIDDLE_THRESHOLD, old)
        gc.collect()
        gc.freeze()  # what start-up made (modules, grpc, metadata) is never walked again
        while True:
            await asyncio.sleep(CHECK_SECONDS)
            self.step()

    def step(self) -> None:
        grown, unloaded = self._counts()
        if unloaded - self._unloaded_at_sweep >= max(SWEEP_AFTER_UNLOADS, grown // 10):
            self._unloaded_at_sweep = unloaded
            self._sweep()
        elif grown - self._grown_at_freeze >= FREEZE_AFTER:
            gc.collect(2)  # walks only the unfrozen objects: the frozen ones are not looked at
            gc.freeze()
            self.freezes += 1
        else:
            return
        self._grown_at_freeze = grown

    def _sweep(self) -> None:
        frozen = gc.get_freeze_count()
        start = time.perf_counter()
        gc.unfreeze()
        found = gc.collect()
        gc.freeze()
        self.sweeps += 1
        log.info(
            "full garbage collection after topic unloads: %d of %d objects were garbage, %.0f ms",
            found,
            frozen,
            (time.perf_counter() - start) * 1e3,
        )
