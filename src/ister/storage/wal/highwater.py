"""When a WAL records its high-water checkpoint (`checkpoint.py` writes the file).

At most once a CHECKPOINT_INTERVAL_S (and on stop) a turn records the committed offset and the lost ranges,
within the pool's budget of checkpoints per second (`WriterPool.reserve_checkpoint`). A failure is logged
once and retried an interval later; it never fails the WAL. `CheckpointSchedule` is the one owner of the
mark (the committed offset the file holds), the timing and the file; used by the writer's pool thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from .checkpoint import Checkpoint, CheckpointFile

log = logging.getLogger(__name__)

# The high-water checkpoint lags the committed offset by about this at most, or longer while the pool's
# checkpoint budget (pool.CHECKPOINTS_PER_SECOND) is spent by many WALs written at once.
CHECKPOINT_INTERVAL_S = 1.0

LostRanges = Callable[[], tuple[tuple[int, int], ...]]


class CheckpointSchedule:
    # slots: one per reliable topic's writer (100,000 of them)
    __slots__ = ("_directory", "_error", "_last", "_slot", "file", "mark")

    def __init__(self, directory: Path, mark: int) -> None:
        self._directory = directory
        self.file = CheckpointFile(directory)  # written by the pool's threads only
        self.mark = mark  # the committed offset the checkpoint file holds
        self._last = 0.0  # when the last one was taken (monotonic)
        self._slot: float | None = None  # when the pool's budget lets the next one be written
        self._error: str | None = None

    def due(
        self, committed: int, final: bool, now: float, reserve: Callable[[float], float], lost: LostRanges
    ) -> Checkpoint | None:
        """The checkpoint to record now for `committed`, or None (not yet, or nothing new). `final`: the
        writer stops, so now whatever the interval and the budget say."""
        if committed <= self.mark:
            return None
        if not final:
            if now - self._last < CHECKPOINT_INTERVAL_S:
                return None
            if self._slot is None:
                self._slot = reserve(now)
            if self._slot > now:
                return None  # the pool's budget is spent for now: the timer brings this writer back then
        self._slot = None
        self._last = now  # a failed write is retried an interval later
        return Checkpoint(committed, lost())

    def deadline(self, committed: int) -> float | None:
        """When the next checkpoint falls due for `committed` (monotonic), or None."""
        if committed <= self.mark:
            return None
        at = self._last + CHECKPOINT_INTERVAL_S
        return at if self._slot is None else max(at, self._slot)

    def failed(self, exc: OSError) -> None:
        if self._error is None:
            log.error("WAL %s: cannot write the high-water checkpoint: %s", self._directory, exc)
        self._error = str(exc)

    def recorded(self, checkpoint: Checkpoint) -> None:
        if self._error is not None:
            log.warning("WAL %s: high-water checkpoint written again", self._directory)
            self._error = None
        self.mark = checkpoint.next_offset

    def cut(self, end: int) -> None:
        """The log was cut to `end`, and its checkpoint file replaced with one that says so."""
        self.mark = end
        self._slot = None
