"""core/cluster/health.py: the cluster's health picture from history entries, move-failure notes and
replica records (pure; the admin RPC and the console show it)."""

from __future__ import annotations

from ister.core.cluster.health import (
    DEFAULT_MOVES,
    MAX_MOVES,
    clamp_moves,
    failed_moves,
    recent_moves,
    replication_issues,
)
from ister.core.cluster.moves import MoveFailure, backoff_seconds
from ister.core.cluster.rebalance import Move
from ister.core.replication import NO_LEADER, ReplicaRecord


def _record(replicas: list[int], isr: list[int], leader: int, min_insync: int = 2) -> ReplicaRecord:
    return ReplicaRecord(replicas=replicas, isr=isr, leader=leader, epoch=1, min_insync=min_insync)


def test_recent_moves_are_newest_first_and_counted() -> None:
    moves = [Move(topic=f"/default/t{i}", from_broker=1, to_broker=2, timestamp=100.0 + i) for i in range(5)]
    shown, total = recent_moves(moves, 2)
    assert [m.topic for m in shown] == ["/default/t4", "/default/t3"] and total == 5
    assert recent_moves([], 10) == ([], 0)


def test_the_move_count_asked_is_bounded() -> None:
    assert clamp_moves(0) == DEFAULT_MOVES and clamp_moves(3) == 3 and clamp_moves(10**6) == MAX_MOVES


def test_failed_moves_say_whether_they_still_back_off() -> None:
    fresh = MoveFailure(from_broker=1, cause="no durable tier", code="failed_precondition", at=1000.0)
    old = MoveFailure(from_broker=2, cause="store down", at=10.0, failures=3)
    out = failed_moves([("/default/old", old), ("/default/fresh", fresh)], now=1000.5)
    assert [f.topic for f in out] == ["/default/fresh", "/default/old"]  # newest first
    assert out[0].backing_off and out[0].retry_at == 1000.0 + backoff_seconds(1)
    assert not out[1].backing_off and out[1].note.failures == 3


def test_replicated_topics_are_sorted_into_their_states() -> None:
    live = {1, 2}  # broker 3 is gone
    records = [
        ("/default/healthy", _record([1, 2], [1, 2], 1)),
        ("/default/under", _record([1, 2, 3], [1, 2, 3], 1)),  # 2 live in sync of 3, min 2
        ("/default/below_min", _record([1, 2, 3], [1, 3], 1)),  # 1 live in sync, min 2
        ("/default/nobody", _record([3, 1], [3], NO_LEADER, min_insync=1)),  # no live in-sync replica
    ]
    under, below_min, count = replication_issues(records, live)
    assert count == 4
    assert [(i.topic, i.state, i.live_isr) for i in under] == [("/default/under", "under-replicated", [1, 2])]
    assert [(i.topic, i.state) for i in below_min] == [
        ("/default/below_min", "under min in-sync"),
        ("/default/nobody", "no live in-sync replica"),
    ]
