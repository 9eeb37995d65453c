"""Liveness and readiness: what `GET /healthz` and `GET /readyz` on the metrics port answer.

Both are answered on the metrics server's own thread, never by waiting for the event loop, so a stuck
loop cannot hide behind a probe that never answers:

- **Liveness** (`/healthz`): the process runs and its event loop turns. The loop's heartbeat (the stall
  watcher stamps it every 20 ms) must be fresher than `live_within` seconds; 503 otherwise. Nothing else
  (etcd, disks) decides liveness: restarting a broker because etcd is down would not bring etcd back.
- **Readiness** (`/readyz`): the broker should get traffic. A task on the event loop runs the readiness
  probes every `every` seconds (each bounded by `probe_timeout`) and keeps the result; the thread reads
  it. Not ready while starting, shutting down, when a probe fails (metadata store not reached, topics
  assigned here not loaded yet, a draining or drained broker, a cluster lease that lapsed), or when the
  last result is older than `stale_after` (the loop is not running the probes).

Each answer is a small JSON document that says why (docs/admin.md, "Health endpoints").
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from ister.limits import (
    HEALTH_LOOP_STALE_SECONDS,
    READY_CHECK_SECONDS,
    READY_PROBE_TIMEOUT_SECONDS,
    READY_STALE_SECONDS,
)
from ister.metadata.store import MetadataStore
from ister.ports.health import Check, ReadyProbe

__all__ = ["Check", "Health", "ReadyProbe", "json_body", "metadata_probe"]

log = logging.getLogger(__name__)

MAX_DETAIL_CHARS = 300  # a failing probe's message, as shown in the body


class Health:
    """`live()` and `ready()` are thread-safe reads; `run()` is a task of the broker's loop. Probes are
    added once the parts they look at exist (`add_probes`): the HTTP server answers before them, while the
    broker still waits for its dependencies."""

    def __init__(
        self,
        heartbeat: Callable[[], float],
        probes: Sequence[tuple[str, ReadyProbe]],
        *,
        clock: Callable[[], float] = time.monotonic,
        live_within: float = HEALTH_LOOP_STALE_SECONDS,
        every: float = READY_CHECK_SECONDS,
        probe_timeout: float = READY_PROBE_TIMEOUT_SECONDS,
        stale_after: float = READY_STALE_SECONDS,
    ) -> None:
        self._heartbeat = heartbeat
        self._probes = list(probes)
        self._clock = clock
        self.live_within = live_within
        self.every = every
        self.probe_timeout = probe_timeout
        self.stale_after = stale_after
        self.started = False  # set once the broker serves (app.py)
        self.stopping = False  # set when shutdown begins
        # What the broker waits for before it can start (etcd, the object store; ister.startwait), if any.
        self.waiting: str | None = None
        self._checked: tuple[float, tuple[Check, ...]] | None = None  # replaced whole: atomic for readers

    def add_probes(self, probes: Sequence[tuple[str, ReadyProbe]]) -> None:
        self._probes.extend(probes)

    # -- on the event loop --------------------------------------------------------------------------------
    async def run(self) -> None:
        while True:
            await self.check_once()
            await asyncio.sleep(self.every)

    async def check_once(self) -> tuple[Check, ...]:
        results = await asyncio.gather(*(self._probe(name, probe) for name, probe in self._probes))
        checks = tuple(c for found in results for c in found)
        self._checked = (self._clock(), checks)
        return checks

    async def _probe(self, name: str, probe: ReadyProbe) -> list[Check]:
        try:
            async with asyncio.timeout(self.probe_timeout):
                found = await probe()
        except TimeoutError:
            return [Check(name, False, f"no answer within {self.probe_timeout:g} s")]
        except Exception as exc:  # a probe that fails says why; it never ends the health task
            log.debug("readiness probe %s failed", name, exc_info=True)
            return [Check(name, False, (str(exc) or type(exc).__name__)[:MAX_DETAIL_CHARS])]
        return [found] if isinstance(found, Check) else list(found)

    # -- from any thread ----------------------------------------------------------------------------------
    def live(self) -> tuple[int, dict[str, Any]]:
        lag = max(0.0, self._clock() - self._heartbeat())
        body: dict[str, Any] = {"status": "ok", "event_loop_lag_seconds": round(lag, 3)}
        if lag > self.live_within:
            body["status"] = "unhealthy"
            body["reason"] = f"the event loop has not run for {lag:.1f} s (limit {self.live_within:g} s)"
            return 503, body
        return 200, body

    def ready(self) -> tuple[int, dict[str, Any]]:
        checked = self._checked
        checks = checked[1] if checked is not None else ()
        reasons = [f"{c.name}: {c.detail}" if c.detail else c.name for c in checks if not c.ok]
        if checked is not None and self._clock() - checked[0] > self.stale_after:
            age = self._clock() - checked[0]
            reasons.insert(0, f"readiness last checked {age:.1f} s ago (the event loop is not running it)")
        if checked is None:
            reasons.insert(0, "starting: readiness not checked yet")
        if not self.started:
            reasons.insert(0, "starting")
        waiting = self.waiting
        if waiting is not None:
            reasons.insert(0, waiting)
        if self.stopping:
            reasons.insert(0, "shutting down")
        body: dict[str, Any] = {
            "status": "not_ready" if reasons else "ready",
            "checks": {c.name: {"ok": c.ok, "detail": c.detail} for c in checks},
        }
        if waiting is not None:
            body["waiting_for"] = waiting
        if reasons:
            body["reasons"] = list(dict.fromkeys(reasons))
        return (503 if reasons else 200), body


def metadata_probe(store: MetadataStore, key: str) -> ReadyProbe:
    """Ready while a read of `key` (present or not) is answered by the metadata store."""

    async def probe() -> Check:
        await store.get(key)
        return Check("metadata", True, "the metadata store answers")

    return probe


def json_body(answer: tuple[int, dict[str, Any]]) -> tuple[int, bytes]:
    status, body = answer
    return status, (json.dumps(body, sort_keys=True) + "\n").encode()
