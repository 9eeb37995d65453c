"""The pure replication rules (core/replication.py) on the failure shapes that bit Kafka and Raft systems."""

from __future__ import annotations

from typing import Any

import pytest

from ister.core.replication import (
    EpochHistory,
    LeaderState,
    ReplicaRecord,
    divergence,
    initial_record,
    promote,
    transfer,
)


def history(*entries: tuple[int, int]) -> EpochHistory:
    return EpochHistory(list(entries))


def test_a_follower_that_is_a_prefix_keeps_everything() -> None:
    leader = history((1, 0), (2, 10))
    assert divergence(leader, 15, history((1, 0), (2, 10)), 12) == 12
    assert divergence(leader, 15, history((1, 0)), 8) == 8


def test_a_follower_with_a_longer_uncommitted_tail_of_an_old_epoch_truncates_it() -> None:
    # Leader of epoch 2 took over at 10; the follower had epoch-1 records up to 14 nobody acknowledged.
    assert divergence(history((1, 0), (2, 10)), 20, history((1, 0)), 14) == 10


def test_a_follower_whose_last_epoch_the_leader_never_had_cuts_its_own_records_of_it() -> None:
    # KIP-279: the follower led epoch 2 alone from offset 5 (nothing acknowledged); the leader went from
    # epoch 1 straight to epoch 3 at offset 7. Its answer for epoch 2 is "epoch 1 ends at 7", but the
    # follower's offsets 5 and 6 are epoch-2 records: they must go too.
    leader = history((1, 0), (3, 7))
    follower = history((1, 0), (2, 5))
    assert divergence(leader, 9, follower, 8) == 5


def test_two_replicas_restarting_together_do_not_truncate_by_a_remembered_watermark() -> None:
    # KIP-101: both hold 0..9 of epoch 1; a follower that remembered committed=6 must not cut to 6.
    both = history((1, 0))
    assert divergence(both, 10, history((1, 0)), 10) == 10


def test_epoch_history_bookkeeping() -> None:
    h = EpochHistory()
    h.begin(1, 0)
    h.begin(1, 3)  # same epoch: nothing new
    h.begin(2, 5)
    h.begin(4, 5)  # epoch 2 never got a record
    assert h.entries == [(1, 0), (4, 5)]
    assert h.epoch_at(4) == 1 and h.epoch_at(5) == 4
    assert h.end_of(3, 9) == (1, 5) and h.end_of(4, 9) == (4, 9) and h.end_of(0, 9) == (0, 0)
    h.truncate(5)
    assert h.entries == [(1, 0)]
    with pytest.raises(ValueError):
        h.begin(0, 1)


def test_commit_needs_every_isr_member_and_never_goes_back() -> None:
    st = LeaderState.take_over(epoch=2, log_end=10, known_committed=7, now=0.0, followers=[1, 2])
    assert st.committed == 7 and not st.serving  # nothing served before epoch 2's start commits
    st.appended(12, 0.0)
    st.acked(1, 12, 1.0)
    assert st.advance([0, 1, 2], 0, 12) == 7  # broker 2 has not answered in this epoch
    st.acked(2, 11, 1.0)
    assert st.advance([0, 1, 2], 0, 12) == 11 and st.serving
    assert st.advance([0, 1], 0, 12) == 12
    assert st.advance([0, 1, 2], 0, 12) == 12  # a member that rejoins lower does not move it back


def test_lagging_followers_leave_and_caught_up_ones_rejoin() -> None:
    st = LeaderState.take_over(epoch=1, log_end=0, known_committed=0, now=0.0, followers=[1, 2])
    st.appended(10, 1.0)
    st.acked(1, 10, 1.0)
    st.acked(2, 3, 1.0)
    assert st.lagging([0, 1, 2], 0, now=3.0, max_lag_s=5.0) == []
    assert st.lagging([0, 1, 2], 0, now=7.0, max_lag_s=5.0) == [2]
    st.advance([0, 1], 0, 10)
    assert st.rejoining([0, 1], [0, 1, 2]) == []
    st.acked(2, 10, 8.0)
    assert st.rejoining([0, 1], [0, 1, 2]) == [2]


def test_promotion_picks_the_live_in_sync_replica_with_the_most_records() -> None:
    rec = ReplicaRecord(replicas=[0, 1, 2], isr=[0, 1, 2], leader=0, epoch=4, min_insync=2)
    new = promote(rec, live={1, 2}, logs={1: (4, 90), 2: (4, 95)})
    assert new is not None and (new.leader, new.epoch, new.isr) == (2, 5, [0, 1, 2])
    out_of_sync = ReplicaRecord(replicas=[0, 1, 2], isr=[0, 1], leader=0, epoch=4, min_insync=2)
    # Broker 2 is alive with more records but not in sync: never promoted; broker 1 is.
    new = promote(out_of_sync, live={1, 2}, logs={1: (4, 50), 2: (4, 99)})
    assert new is not None and new.leader == 1
    assert promote(out_of_sync, live={2}, logs={2: (4, 99)}) is None  # wait rather than lose records


def test_records_are_checked_and_transfers_stay_in_sync() -> None:
    rec = initial_record([3, 1, 2], min_insync=2)
    assert rec.leader == 3 and rec.isr == [1, 2, 3] and ReplicaRecord.parse(rec.to_json()) == rec
    assert ReplicaRecord.parse({**rec.to_json(), "leader": 9}) is None
    assert ReplicaRecord.parse({**rec.to_json(), "min_insync": 4}) is None
    assert ReplicaRecord.parse({**rec.to_json(), "replicas": [1, 1, 2]}) is None
    moved = transfer(rec, 1)
    assert moved is not None and (moved.leader, moved.epoch) == (1, 2)
    assert transfer(rec.with_isr([2, 3]), 1) is None


def test_a_restarted_leader_never_resumes_its_old_epoch() -> None:
    from ister.core.replication import NO_LEADER, after_restart

    rec = ReplicaRecord(replicas=[0, 1, 2], isr=[0, 1, 2], leader=0, epoch=3, min_insync=2)
    logs = {0: (3, 40), 1: (3, 38), 2: (3, 40)}
    kept = after_restart(rec, 0, disk_intact=True, live={0, 1, 2}, logs=logs)
    assert kept is not None and kept.epoch == 4 and kept.leader == 0  # most records, lowest id
    empty = after_restart(rec, 0, disk_intact=False, live={0, 1, 2}, logs={**logs, 0: (0, 0)})
    assert empty is not None and (empty.leader, empty.epoch, empty.isr) == (2, 4, [1, 2])
    alone = after_restart(rec.with_isr([0, 1]), 0, disk_intact=False, live={0}, logs={0: (0, 0)})
    assert alone is not None and (alone.leader, alone.isr) == (NO_LEADER, [1])  # waits for broker 1
    assert after_restart(rec, 1, disk_intact=True, live={0, 1, 2}, logs=logs) is None
    follower = after_restart(rec, 1, disk_intact=False, live={0, 1, 2}, logs=logs)
    assert follower is not None and follower.isr == [0, 2] and follower.epoch == 3


def test_replacement_adds_a_follower_before_dropping_the_leaving_one() -> None:
    from ister.core.replication import replacement_step

    rec = ReplicaRecord(replicas=[1, 2, 3], isr=[1, 2], leader=1, epoch=4, min_insync=2)
    added = replacement_step(rec, {3}, lambda: [3, 4, 5])
    assert added is not None and added.replicas == [1, 2, 3, 4] and added.isr == [1, 2]
    # Not yet: the new follower is not in sync.
    assert replacement_step(added, {3}, lambda: [5]) is None
    synced = added.with_isr([1, 2, 4])
    dropped = replacement_step(synced, {3}, lambda: [5])
    assert dropped is not None and dropped.replicas == [1, 2, 4] and dropped.isr == [1, 2, 4]
    assert replacement_step(dropped, set(), lambda: [5]) is None  # at its factor: nothing to do


def test_replacement_without_candidates_drops_only_above_the_minimum() -> None:
    from ister.core.replication import replacement_step

    rec = ReplicaRecord(replicas=[1, 2, 3], isr=[1, 2, 3], leader=1, epoch=1, min_insync=2)
    dropped = replacement_step(rec, {3}, list)
    assert dropped is not None and dropped.replicas == [1, 2] and dropped.isr == [1, 2]
    two = ReplicaRecord(replicas=[1, 2], isr=[1, 2], leader=1, epoch=1, min_insync=2)
    assert replacement_step(two, {2}, list) is None  # one copy would be left: it stays
    assert replacement_step(rec, {1}, list) is None  # the leader never replaces itself


def test_a_topic_below_its_factor_grows_when_a_broker_is_there() -> None:
    from ister.core.replication import replacement_step

    rec = ReplicaRecord(replicas=[1, 2], isr=[1, 2], leader=1, epoch=1, min_insync=2, factor=3)
    grown = replacement_step(rec, set(), lambda: [2, 7])
    assert grown is not None and grown.replicas == [1, 2, 7] and grown.isr == [1, 2]
    assert ReplicaRecord.parse({**rec.to_json(), "factor": 9}) is None


def test_followers_spread_over_zones_before_filling_one() -> None:
    from ister.core.cluster.load import spread_over_zones

    zones = {1: "a", 2: "a", 3: "b", 4: "b", 5: "c"}
    # ranked best first; the leader's zone "a" is taken
    assert spread_over_zones([2, 3, 4, 5], zones, {"a"}, 2) == [3, 5]
    assert spread_over_zones([2, 3, 4], zones, {"a"}, 2) == [3, 2]  # two zones only: then the best left
    assert spread_over_zones([2, 3, 4], {}, {""}, 2) == [2, 3]  # no zones: the ranking as it is


def test_leaving_replicas_draining_at_once_dead_after_the_grace() -> None:
    from ister.core.replication import leaving_replicas

    rec = ReplicaRecord(replicas=[1, 2, 3, 4], isr=[1, 2, 3, 4], leader=1, epoch=1, min_insync=2)
    absent: dict[int, float] = {}
    # 2 drains (live, not active), 3 is gone, 4 is fine; the leader (1) is never its own replacement.
    live, active = {1, 2, 4}, {4}
    assert leaving_replicas(rec, 1, live, active, absent, 100.0, 30.0) == {2}
    assert leaving_replicas(rec, 1, live, active, absent, 129.0, 30.0) == {2}
    assert leaving_replicas(rec, 1, live, active, absent, 130.0, 30.0) == {2, 3}
    # 3 came back: its absence is forgotten, the grace starts again next time it goes.
    assert leaving_replicas(rec, 1, {1, 2, 3, 4}, {1, 3, 4}, absent, 131.0, 30.0) == {2}
    assert absent == {}
    assert leaving_replicas(rec, 1, {1, 2, 4}, {1, 4}, absent, 140.0, 30.0) == {2}


def test_drain_moves_the_brokers_leaderships_and_its_copies_away() -> None:
    """Broker 1 drains. It leads T and follows U. The leader's planner hands T to an in-sync replica (a
    transfer); then each topic's leader sees 1 leaving, adds the least loaded active broker and drops 1
    once the new copy is in sync. Nothing is ever placed on 1; no topic has fewer than 3 in-sync copies."""
    from ister.core.cluster.assignment import BrokerSelector, Marker
    from ister.core.cluster.load import LoadReport, rank_replica_candidates
    from ister.core.cluster.planner import DRAINING, ClusterState, plan_assignments
    from ister.core.replication import leaving_replicas, replacement_step

    live = {1, 2, 3, 4, 5}
    modes = {1: DRAINING}
    active = {b for b in live if modes.get(b) != DRAINING}
    t = ReplicaRecord(replicas=[1, 2, 3], isr=[1, 2, 3], leader=1, epoch=3, min_insync=2, factor=3)
    u = ReplicaRecord(replicas=[2, 1, 3], isr=[1, 2, 3], leader=2, epoch=1, min_insync=2, factor=3)

    # The drain's unload of T (sealed and ready): assigned to an in-sync replica, never back to 1.
    state = ClusterState(
        live=live, assignments={}, unassigned={"/n/t": Marker("unload", from_broker=1)}, modes=modes
    )
    plan = plan_assignments(state, BrokerSelector(), eligible={"/n/t": set(t.isr)})
    assert len(plan) == 1 and plan[0].broker in {2, 3}
    moved = transfer(t, plan[0].broker)
    assert moved is not None and moved.leader != 1

    # 4 is busy (a heavy led topic), 5 is idle: new copies go to 5 first.
    reports = {
        4: LoadReport.build(4, 0, [_busy("/n/busy")]),
        5: LoadReport.build(5, 0),
    }
    records = {"/n/t": moved, "/n/u": u}
    for _ in range(6):  # each leader's replacement passes; a new copy catches up between them
        for name, rec in list(records.items()):
            copies = {b: sum(b in r.replicas and b != r.leader for r in records.values()) for b in live}
            leaving = leaving_replicas(rec, rec.leader, live, active, {}, 0.0, 30.0)
            step = replacement_step(
                rec,
                leaving,
                lambda r=rec, c=copies: rank_replica_candidates(active - set(r.replicas), [], reports, c),
            )
            if step is not None:
                assert len(step.isr) >= 3  # a copy leaves only once its replacement is in sync
                rec = step.with_isr(step.replicas)  # the new follower catches up
                records[name] = rec
    for rec in records.values():
        assert 1 not in rec.replicas and 1 not in rec.isr
        assert len(rec.replicas) == 3 and rec.leader in active
    assert 5 in records["/n/t"].replicas  # the idle broker took the first new copy


def _busy(name: str) -> Any:
    from ister.core.cluster.load import TopicLoad

    return TopicLoad.build(name, byte_rate=50e6, producer_count=4, consumer_count=8)


def test_the_replication_state_says_first_what_an_operator_must_know() -> None:
    from ister.core.replication import NO_LIVE_ISR, replication_state

    record = ReplicaRecord(replicas=[1, 2, 3], isr=[1, 2], leader=1, epoch=4, min_insync=2)
    assert replication_state(record, {1, 2, 3}) == "under-replicated"  # 3 is live but out of sync
    assert replication_state(record.with_isr([1, 2, 3]), {1, 2, 3}) == "healthy"
    assert replication_state(record.with_isr([1, 2, 3]), {1, 2}) == "under-replicated"
    assert replication_state(record, {1, 3}) == "under min in-sync"
    assert replication_state(record, {3}) == NO_LIVE_ISR  # only an out-of-sync copy is left
    assert replication_state(record, set()) == NO_LIVE_ISR


def test_an_unclean_recovery_takes_the_longest_copy_and_never_reuses_an_offset() -> None:
    import pytest

    from ister.core.replication import NO_LEADER, CopyEnd, unclean_recovery

    record = ReplicaRecord(replicas=[1, 2, 3], isr=[1], leader=1, epoch=7, min_insync=2)
    copies = {2: CopyEnd(6, 900, 850), 3: CopyEnd(7, 500, 480)}
    plan = unclean_recovery(record, {2, 3, 4}, copies, tier_end=300, reserved_until=1_500)
    # 3 has the newer epoch: its copy wins although 2's is longer (2's tail past epoch 6 may diverge).
    assert plan.leader == 3 and plan.kept_end == 500 and plan.resume_at == 1_500
    assert plan.acked_end == 850  # 2 had heard of a commit up to 850: 500..849 were acknowledged for certain
    assert plan.record.isr == [3] and plan.record.leader == NO_LEADER and plan.record.epoch == 8
    assert plan.record.resume_at == 1_500 and plan.record.valid()
    # The durable tier beyond every copy is kept; offsets are never reused below what was reserved.
    plan = unclean_recovery(record, {2}, {2: CopyEnd(6, 100, 0)}, tier_end=400, reserved_until=350)
    assert (plan.leader, plan.kept_end, plan.resume_at, plan.acked_end) == (2, 400, 400, 400)
    # No replica lives: any live broker restarts it from the tier alone.
    plan = unclean_recovery(record, {5}, {}, tier_end=0, reserved_until=64)
    assert plan.leader == 5 and plan.record.replicas == [5, 1, 2] and plan.kept_end == 0
    with pytest.raises(ValueError, match="live"):
        unclean_recovery(record, {1, 2}, copies, 0, 10)  # 1 is in sync and live: no recovery
    with pytest.raises(ValueError, match="no broker"):
        unclean_recovery(record, set(), {}, 0, 10)
    assert "resume_at" not in record.to_json()
    assert ReplicaRecord.parse(plan.record.to_json()) == plan.record
