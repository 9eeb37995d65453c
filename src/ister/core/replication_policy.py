"""How many copies a replicated topic gets (pure): the topic's own setting, else its namespace policy's, else
the broker's configuration, field by field (docs/replication.md, "Replication factor").

Each layer may leave a field unset (None; 0 in the broker's `min_insync_replicas` means the same). The
minimum in-sync set defaults to a majority of the factor and never exceeds it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ister.core.replication import MAX_REPLICATION_FACTOR
from ister.errors import InvalidArgument


@dataclass(frozen=True, slots=True)
class ReplicationSetting:
    """One layer's replication settings; None: not set here."""

    replication_factor: int | None = None
    min_insync_replicas: int | None = None


@dataclass(frozen=True, slots=True)
class Replication:
    factor: int  # copies the topic should have
    placed: int  # copies it can have now (at most one per live broker)
    min_insync: int


def majority(factor: int) -> int:
    return factor // 2 + 1


def _first(values: list[int | None]) -> int | None:
    # 0 counts as unset: older records and the broker's `min_insync_replicas: 0` (a majority) use it.
    return next((v for v in values if v), None)


def resolve(layers: list[ReplicationSetting], live_brokers: int) -> Replication:
    """The replication of a topic loaded for the first time; `layers` from the most specific (the topic)
    to the least (the broker's configuration). Out-of-range stored values are clamped, never refused: a
    topic must load whatever another tool wrote."""
    factor = _first([layer.replication_factor for layer in layers]) or 1
    factor = max(1, min(factor, MAX_REPLICATION_FACTOR))
    min_insync = _first([layer.min_insync_replicas for layer in layers]) or majority(factor)
    return Replication(factor, max(1, min(factor, live_brokers)), max(1, min(min_insync, factor)))


def check_setting(setting: ReplicationSetting, inherited_factor: int) -> None:
    """InvalidArgument unless the factor is in 1..MAX and the minimum in 1..factor, where the factor is the
    one given, else `inherited_factor` (what the topic or namespace would get without it)."""
    factor, min_insync = setting.replication_factor, setting.min_insync_replicas
    if factor is not None and not 1 <= factor <= MAX_REPLICATION_FACTOR:
        raise InvalidArgument(f"replication_factor must be in 1..{MAX_REPLICATION_FACTOR}, got {factor}")
    if min_insync is not None:
        effective = factor if factor is not None else inherited_factor
        if not 1 <= min_insync <= effective:
            where = "" if factor is not None else " (the replication factor that applies)"
            raise InvalidArgument(f"min_insync_replicas must be in 1..{effective}{where}, got {min_insync}")
