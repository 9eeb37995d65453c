"""Group linger (fsync always): when a busy WAL's writer should wait a little before taking its group.

A group is flushed as soon as a pool thread takes it, so when appends come one at a time (a Danube client
sends one message per call) the first after an idle moment is flushed alone and the rest queue behind that
flush; the requests then move in convoys and both cores sit idle while each flush runs (docs/benchmarks.md,
session 17). When the writer's appends have lately come less than `group_linger_us` apart (a moving
average of the gaps, kept by `submitted`) and its groups lately held more than one append now and then
(several appends in flight, not one producer waiting for each acknowledgement), a pool thread whose only
work is this writer waits that long before taking its group (`WalWriter.lingers`, `pool._take_batch`).
Appends that come further apart (1,000 a second and fewer at the default 400 µs) or one at a time are
flushed at once; and when waiting has lately not brought more appends (a producer that sends a few at once
and waits for them), the writer stops waiting, trying once every LINGER_RETRY_AFTER turns whether it pays
again.

`GroupLinger` keeps the traffic's averages and decides from them; the writer adds what its own state
forbids (a flush marker, a cut, a stop). Guarded by the pool's lock, like the writer's queue.
"""

from __future__ import annotations

LINGER_MAX = 64  # appends queued: no reason to wait for more
LINGER_SHARING = 0.2  # groups lately holding more than one append, at least this share of them
LINGER_GAIN = 0.3  # waits lately followed by more appends, at least this share of them
LINGER_RETRY_AFTER = 16  # turns skipped for lack of gain before one wait to measure it again


class GroupLinger:
    # slots: one per reliable topic's writer (100,000 of them)
    __slots__ = ("gain", "gap", "last_submit", "linger_s", "sharing", "skipped")

    def __init__(self, linger_us: int) -> None:
        self.linger_s = linger_us / 1e6
        self.last_submit = 0.0
        self.gap = 1.0  # moving average of the time between appends, seconds (starts as "slow")
        self.sharing = 0.0  # moving average of "the group had more than one append" (0..1)
        self.gain = 1.0  # moving average of "more appends came while a thread waited" (0..1)
        self.skipped = 0  # turns not lingered for lack of gain since the last linger

    def submitted(self, now: float) -> None:
        """An append was queued at `now` (monotonic)."""
        self.gap += (now - self.last_submit - self.gap) * 0.25
        self.last_submit = now

    def took(self, taken: int) -> None:
        """A turn took a group of `taken` entries (> 0)."""
        self.sharing += (min(taken, 2) - 1 - self.sharing) * 0.25

    def pays(self, queued: int) -> bool:
        """Whether the traffic says waiting would let one flush serve more appends (`queued` waiting)."""
        if not self.linger_s or queued >= LINGER_MAX:
            return False
        if self.gap >= self.linger_s or self.sharing < LINGER_SHARING:
            return False
        if self.gain < LINGER_GAIN:
            # Waiting did not bring more appends lately (a producer that sends a few at once and waits for
            # them): skip it, but try again now and then in case the traffic changed.
            self.skipped += 1
            return self.skipped >= LINGER_RETRY_AFTER
        return True

    def lingered(self, gained: bool) -> None:
        """A pool thread waited; `gained`: appends came meanwhile."""
        self.gain += (gained - self.gain) * 0.25
        self.skipped = 0
