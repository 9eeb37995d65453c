"""The cluster's health picture for the admin API (`IsterAdmin.GetClusterHealth`): recent rebalancing moves,
failed moves, and replicated topics below their replica count or their minimum in-sync set.

Pure: the caller passes what its metadata cache holds (history entries, move-failure notes, replica
records), the registered brokers and the time.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ister.core.cluster.moves import MoveFailure, backing_off, backoff_seconds
from ister.core.cluster.rebalance import Move
from ister.core.replication import NO_LIVE_ISR, ReplicaRecord, replication_state

DEFAULT_MOVES = 50  # newest rebalancing moves returned when the caller does not say
MAX_MOVES = 1_000
UNDER_REPLICATED = "under-replicated"
UNDER_MIN_ISR = ("under min in-sync", NO_LIVE_ISR)  # both are below the minimum in-sync set


@dataclass(frozen=True, slots=True)
class FailedMove:
    topic: str
    note: MoveFailure
    backing_off: bool  # the load manager still leaves the topic where it is
    retry_at: float  # unix seconds: when the backoff ends


@dataclass(frozen=True, slots=True)
class ReplicationIssue:
    topic: str
    state: str  # core.replication.replication_state
    record: ReplicaRecord
    live_isr: list[int]  # in-sync replicas whose brokers are registered


@dataclass(frozen=True, slots=True)
class ClusterHealth:
    mode: str  # "cluster" or "standalone"
    note: str = ""  # what does not apply, for a standalone broker
    moves: list[Move] = field(default_factory=list)  # newest first
    moves_total: int = 0  # history entries kept (the newest `len(moves)` are listed)
    failed_moves: list[FailedMove] = field(default_factory=list)
    under_replicated: list[ReplicationIssue] = field(default_factory=list)
    under_min_isr: list[ReplicationIssue] = field(default_factory=list)
    replicated_topics: int = 0


def recent_moves(history: Iterable[Move], limit: int) -> tuple[list[Move], int]:
    """The newest `limit` moves, newest first, and how many there are."""
    ordered = sorted(history, key=lambda m: (m.timestamp, m.topic), reverse=True)
    return ordered[:limit], len(ordered)


def failed_moves(notes: Iterable[tuple[str, MoveFailure]], now: float) -> list[FailedMove]:
    """Every recorded failed move, newest first: a note stays until the topic moves, so one whose backoff
    has ended still says why the last try failed."""
    out = [
        FailedMove(topic, note, backing_off(note, now), note.at + backoff_seconds(note.failures))
        for topic, note in notes
    ]
    return sorted(out, key=lambda f: (-f.note.at, f.topic))


def replication_issues(
    records: Iterable[tuple[str, ReplicaRecord]], live: set[int]
) -> tuple[list[ReplicationIssue], list[ReplicationIssue], int]:
    """(under-replicated, under min in-sync, replicated topics counted), each list sorted by topic."""
    under: list[ReplicationIssue] = []
    below_min: list[ReplicationIssue] = []
    count = 0
    for topic, record in sorted(records, key=lambda tr: tr[0]):
        count += 1
        state = replication_state(record, live)
        issue = ReplicationIssue(topic, state, record, [b for b in record.isr if b in live])
        if state == UNDER_REPLICATED:
            under.append(issue)
        elif state in UNDER_MIN_ISR:
            below_min.append(issue)
    return under, below_min, count


def clamp_moves(asked: int) -> int:
    """The number of moves to list: 0 means the default; at most MAX_MOVES."""
    return DEFAULT_MOVES if asked <= 0 else min(asked, MAX_MOVES)
