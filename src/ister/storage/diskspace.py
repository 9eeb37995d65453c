"""Free space of the data disk, and the headroom below which this broker stops writing new records.

A background task asks `statvfs` about once a second (on a thread, with a timeout) and keeps the answer
in `DiskSpace.refusal`: None while the data disk has at least the headroom free, else the reason. The
publish path does no syscall per message or batch: it reads that attribute and takes its payload bytes
from `budget` (what may still be written before the headroom, as of the last measurement), so a fast
publisher is refused when its writes since the last measurement would reach the headroom, not a second
later. A reliable publish is refused with `DiskFull` (RESOURCE_EXHAUSTED, retriable) "data disk has less
than X free" while `refusal` is set, and is taken again at the first measurement that finds the headroom
free (retention, or an operator, freed space). A
replica follower stops copying meanwhile (replication/follower.py). The headroom leaves room for what
must still be written while publishes are refused: cursors, metadata, checkpoints, replica cuts.

If the disk fills anyway (other writers, a burst between two checks, a headroom of 0), the WAL writer's
ENOSPC is the answer (`DiskFull` "disk full", storage/wal/writer.py); `wake` has the next check run now.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import Gauge

from ister.tasks import TaskSupervisor

log = logging.getLogger(__name__)

CHECK_INTERVAL_SECONDS = 1.0
STATVFS_TIMEOUT_SECONDS = 5.0  # a data disk that does not answer statvfs (a hung NFS mount): keep the last
RESUME_MARGIN = 10  # refusing stops with headroom + headroom / RESUME_MARGIN free
UNLIMITED = sys.maxsize  # the budget while the headroom check is off or nothing is measured yet

free_bytes_gauge = Gauge(
    "ister_data_disk_free_bytes", "Bytes free on the data disk (statvfs f_bavail), measured every second"
)
headroom_gauge = Gauge(
    "ister_data_disk_headroom_bytes",
    "Free bytes below which the broker refuses publishes (storage.min_free_bytes / min_free_ratio)",
)
refusing_gauge = Gauge("ister_data_disk_refusing", "1 while publishes are refused for lack of disk space")


@dataclass(frozen=True, slots=True)
class Headroom:
    """`storage.min_free_bytes` and `storage.min_free_ratio`: the headroom is the smaller of the two (so
    the byte default does not take a small disk whole); either one 0 turns the check off."""

    min_free_bytes: int
    min_free_ratio: float

    def bytes_for(self, total: int) -> int:
        if self.min_free_bytes <= 0 or self.min_free_ratio <= 0:
            return 0
        return min(self.min_free_bytes, int(total * self.min_free_ratio))


def human(n: int) -> str:
    """Bytes as an operator reads them: 1.0 GiB, 3.5 MiB, 512 B."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


class DiskSpace:
    """The data disk's free space, checked in the background; `refusal` is read on the publish path."""

    def __init__(
        self,
        path: Path,
        headroom: Headroom,
        *,
        interval: float = CHECK_INTERVAL_SECONDS,
        statvfs: Callable[[Path], os.statvfs_result] = os.statvfs,
    ) -> None:
        self.path = path
        self.headroom = headroom
        self.interval = interval
        self._statvfs = statvfs
        self.refusal: str | None = None  # why new records are refused now; None: they are taken
        # Bytes that may still be written before the headroom is reached: the last measurement's free bytes
        # minus the headroom, minus the payloads taken since (`take`). Frame headers and metadata are not
        # counted; the next measurement corrects the estimate.
        self.budget = UNLIMITED
        self.free_bytes = -1  # -1: not known yet
        self.total_bytes = -1
        self.room = asyncio.Event()  # set while refusal is None (followers wait on it)
        self.room.set()
        self._wake = asyncio.Event()
        self._tasks = TaskSupervisor("data disk space")  # its measuring loop
        self._error: str | None = None  # the last statvfs failure, logged once

    def update(self, free: int, total: int) -> None:
        """Take one measurement (bytes free to unprivileged writers, and the disk's size). Once refusing,
        publishes are taken again only with a tenth of the headroom more free (no flapping at the edge)."""
        self.free_bytes, self.total_bytes = free, total
        need = self.headroom.bytes_for(total)
        free_bytes_gauge.set(free)
        headroom_gauge.set(need)
        self.budget = free - need if need else UNLIMITED
        if need and (free < need or (self.refusal is not None and free < need + need // RESUME_MARGIN)):
            self._refuse(f"{human(free)} of {human(total)} free")
        elif self.refusal is not None:
            log.warning(
                "data disk has %s free again (headroom %s) at %s: publishes are accepted",
                human(free),
                human(need),
                self.path,
            )
            self.refusal = None
            refusing_gauge.set(0)
            self.room.set()

    def take(self, nbytes: int) -> str | None:
        """A reliable publish of `nbytes` payload bytes is about to be written: None when it may be (its
        bytes are taken from the budget), else why not. Called per publish call; no syscall."""
        if self.refusal is None:
            if nbytes <= self.budget:
                self.budget -= nbytes
                return None
            # The writes since the last measurement would reach the headroom: refuse now, measure at once.
            need = self.headroom.bytes_for(self.total_bytes)
            written = self.free_bytes - need - self.budget
            self._refuse(f"{human(self.free_bytes)} free, then about {human(written)} written")
            self.wake()
        return self.refusal

    def _refuse(self, state: str) -> None:
        need = self.headroom.bytes_for(self.total_bytes)
        reason = (
            f"data disk has less than {human(need)} free ({state}, at {self.path}): publishes are "
            "refused until retention or an operator frees space"
        )
        if self.refusal is None:
            log.error("%s", reason)
            refusing_gauge.set(1)
            self.room.clear()
        self.refusal = reason

    async def refresh(self) -> None:
        """Measure now. A failed or hung statvfs keeps the last state (logged once until it works)."""
        try:
            async with asyncio.timeout(STATVFS_TIMEOUT_SECONDS):
                st = await asyncio.to_thread(self._statvfs, self.path)
        except (OSError, TimeoutError) as exc:
            problem = str(exc) or "timed out"
            if self._error is None:
                log.error("cannot measure free space of the data disk %s: %s", self.path, problem)
            self._error = problem
            return
        if self._error is not None:
            log.warning("free space of the data disk %s is measured again", self.path)
            self._error = None
        self.update(st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize)

    def wake(self) -> None:
        """Measure at once (the WAL met a full disk): refusals start before the next interval."""
        self._wake.set()

    async def start(self) -> None:
        """Measure once (publishes are refused from the first one on when the disk is already full), then
        keep measuring in the background."""
        await self.refresh()
        self._tasks.spawn(self._run(), "data disk space")

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval):
                    await self._wake.wait()
            self._wake.clear()
            await self.refresh()

    async def close(self) -> None:
        await self._tasks.close()
