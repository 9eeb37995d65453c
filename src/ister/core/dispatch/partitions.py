"""Partitioned subscriptions (issue 19, docs/architecture.md): which consumer gets which partition, and the
graceful handoff of a partition from one consumer to another.

Assignment (`assign`) is balanced (counts differ by at most one) and sticky (a change moves the fewest
partitions): every consumer keeps what it has up to its quota, and the quotas with one extra go to the
consumers that already hold the most. `RebalanceTimer` waits `rebalance_delay` after the last membership
change, so a burst of joins moves partitions once.

A handoff follows the four steps of graceful partition handoff (`Handoff`): pause new deliveries of the
partition to its current consumer (messages stay queued, new ones too); wait until its delivered messages
are acknowledged or `max_handoff_time` passes (at once when the consumer is gone); switch the partition to
the new consumer; resume, redelivering only what was delivered and not acknowledged. Partitions that do not
move are never paused.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum


def quotas(partitions: int, consumers: Sequence[str], current: Mapping[int, str]) -> dict[str, int]:
    """How many partitions each consumer gets: n // k each, one more for the n % k consumers that hold the
    most now (then by name), so as few partitions as possible move."""
    if not consumers:
        return {}
    base, extra = divmod(partitions, len(consumers))
    held = {c: 0 for c in consumers}
    for owner in current.values():
        if owner in held:
            held[owner] += 1
    ranked = sorted(consumers, key=lambda c: (-held[c], c))
    return {c: base + (1 if i < extra else 0) for i, c in enumerate(ranked)}


def assign(partitions: Sequence[int], consumers: Sequence[str], current: Mapping[int, str]) -> dict[int, str]:
    """partition -> consumer: balanced and sticky (see the module docstring). Empty without consumers."""
    if not consumers:
        return {}
    quota = quotas(len(partitions), consumers, {p: c for p, c in current.items() if p in set(partitions)})
    out: dict[int, str] = {}
    count = dict.fromkeys(consumers, 0)
    loose: list[int] = []
    for p in sorted(partitions):
        owner = current.get(p)
        if owner in quota and count[owner] < quota[owner]:
            out[p] = owner
            count[owner] += 1
        else:
            loose.append(p)
    for p in loose:
        # The consumer furthest below its quota (then by name): spreads the loose partitions evenly.
        target = min((c for c in consumers if count[c] < quota[c]), key=lambda c: (count[c] - quota[c], c))
        out[p] = target
        count[target] += 1
    return out


def common_members(attached: Mapping[int, Iterable[str]], partitions: int) -> list[str]:
    """The consumer names attached on every partition 0..partitions-1 (none while one has no report)."""
    names: set[str] | None = None
    for p in range(partitions):
        here = set(attached.get(p, ()))
        names = here if names is None else names & here
    return sorted(names or ())


def moves(old: Mapping[int, str], new: Mapping[int, str]) -> list[tuple[int, str | None, str]]:
    """(partition, from, to) of every partition whose consumer changes (from None: it had none)."""
    return [(p, old.get(p), c) for p, c in sorted(new.items()) if old.get(p) != c]


@dataclass(slots=True)
class RebalanceTimer:
    """Fires `delay` seconds after the last membership change (0: at once)."""

    delay: float
    due: float | None = None

    def changed(self, now: float) -> None:
        self.due = now + self.delay

    def fire(self, now: float) -> bool:
        if self.due is not None and now >= self.due:
            self.due = None
            return True
        return False


class Step(StrEnum):
    PAUSED = "paused"  # no new deliveries to the old consumer; waiting for its acknowledgements
    SWITCHED = "switched"  # the new consumer has the partition; what was not acknowledged goes to it


@dataclass(slots=True)
class Handoff:
    """One partition moving from `source` to `target` (source None: it had no consumer, no wait)."""

    partition: int
    source: str | None
    target: str
    paused_at: float
    max_handoff_s: float
    step: Step = Step.PAUSED
    switched_at: float | None = None

    def ready(self, now: float, unacked: int, source_alive: bool) -> bool:
        """May the partition switch now: the source acknowledged everything it was given, or is gone, or
        the handoff time ran out."""
        return (
            self.source is None
            or not source_alive
            or unacked == 0
            or now - self.paused_at >= self.max_handoff_s
        )

    def switch(self, now: float) -> None:
        self.step = Step.SWITCHED
        self.switched_at = now

    @property
    def paused_for(self) -> float:
        return (self.switched_at - self.paused_at) if self.switched_at is not None else 0.0


def plan_handoffs(
    old: Mapping[int, str],
    new: Mapping[int, str],
    now: float,
    max_handoff_s: float,
    pending: Mapping[int, Handoff] | None = None,
) -> tuple[dict[int, Handoff], list[int]]:
    """(the handoffs after a rebalance, partitions to resume at once at their current consumer).

    A partition whose consumer changes gets a handoff; the others are not touched (Goal 2). A partition
    already handing off keeps its source and the time it was paused (the consumer holding its deliveries is
    still that source, whatever the assignment said since); if the new target is that source, the handoff
    is cancelled and the partition resumes where it was.
    """
    pending = pending or {}
    out: dict[int, Handoff] = {}
    resume: list[int] = []
    for p, target in sorted(new.items()):
        h = pending.get(p)
        if h is not None:
            if h.source == target:
                resume.append(p)
            else:
                out[p] = Handoff(p, h.source, target, h.paused_at, max_handoff_s)
        elif old.get(p) != target:
            out[p] = Handoff(p, old.get(p), target, now, max_handoff_s)
    return out, resume
