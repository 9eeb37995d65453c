"""The replacement clock of a replicated topic's leader (issue 39): when a replica's broker was first seen
gone is kept outside the leader (in metadata, `/ister/absent-brokers/`), so the wait survives a change of
leader; a failure to record it is retried and replaces nothing early."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ister.clock import VirtualClock
from ister.core.replication import EpochHistory, ReplicaRecord, clocks_to_forget
from ister.errors import MetadataError
from ister.ids import TopicName
from ister.metadata import keys
from ister.metadata.embedded import EmbeddedStore
from ister.replication.insync import ISR_CHECK_SECONDS, PEERS_CHECK_SECONDS
from ister.replication.leader import ReplicaLeader
from ister.storage.wal import Wal, WalConfig
from tests.support import advance_until

NAME = TopicName.parse("/default/replaced")
RECORD = ReplicaRecord(replicas=[1, 2, 3], isr=[1, 2, 3], leader=1, epoch=2, min_insync=2)
REPLACE_AFTER = 50.0


class Absences:
    """The metadata's absent-broker clocks, as the leader sees them; `failures` refusals first."""

    def __init__(self, kept: dict[int, float], failures: int = 0) -> None:
        self.kept = kept
        self.failures = failures
        self.calls = 0
        self.checks = 0  # the leader's looks at the cluster's brokers

    def peers(self) -> tuple[set[int], set[int]]:
        self.checks += 1
        return {1, 3, 4}, {1, 3, 4}  # broker 2 is gone

    def read(self) -> dict[int, float]:
        return dict(self.kept)

    async def note(self, seen: dict[int, float], restamp: bool) -> None:
        self.calls += 1
        if self.failures:
            self.failures -= 1
            raise MetadataError("etcd unreachable")
        for broker, since in seen.items():
            if restamp:
                self.kept[broker] = since
            else:
                self.kept.setdefault(broker, since)


def wall_clock() -> VirtualClock:
    """Virtual time whose wall clock reads 1,000 s and moves only when the test sets it."""
    return VirtualClock(wall_start=1_000.0, wall_moves=False)


async def ticks(clock: VirtualClock, check: Callable[[], object], what: str) -> None:
    """The leader's in-sync checks run (virtual time advancing) until `check` holds."""
    await advance_until(clock, check, what, ISR_CHECK_SECONDS, 60 * PEERS_CHECK_SECONDS)


async def leader_with(tmp_path: Path, absences: Absences, clock: VirtualClock) -> tuple[ReplicaLeader, Wal]:
    store = EmbeddedStore.in_memory()
    await store.put(keys.replicas(NAME), RECORD.to_json())
    kv = await store.get(keys.replicas(NAME))
    assert kv is not None
    wal = await Wal.open(tmp_path, WalConfig())
    history = EpochHistory()
    history.begin(RECORD.epoch, 0)
    leader = ReplicaLeader(
        NAME,
        wal,
        history,
        RECORD,
        kv.version,
        store,
        1,
        10.0,
        peers=absences.peers,
        choose=lambda exclude: [b for b in [4] if b not in exclude],
        replace_after_s=REPLACE_AFTER,
        live=lambda: {1, 3, 4},
        absences=absences.read,
        note_absent=absences.note,
        clock=clock,
    )
    leader.start()
    return leader, wal


async def test_a_clock_started_under_an_earlier_leader_is_kept(tmp_path: Path) -> None:
    clock = wall_clock()
    # An earlier leader saw broker 2 gone 60 s ago: this one replaces it at once, not 50 s from now.
    absences = Absences({2: clock.time() - 60})
    leader, wal = await leader_with(tmp_path, absences, clock)
    try:
        await ticks(clock, lambda: 4 in leader.record.replicas, "the new follower added")
        assert absences.kept == {2: clock.time() - 60}  # the earlier clock, not restarted
    finally:
        await leader.close("test over")
        await wal.close()


async def test_a_new_absence_waits_the_whole_time_and_a_failed_record_is_retried(tmp_path: Path) -> None:
    clock = wall_clock()
    absences = Absences({}, failures=2)
    leader, wal = await leader_with(tmp_path, absences, clock)
    try:
        await ticks(clock, lambda: absences.kept == {2: 1_000.0}, "the absence recorded after two failures")
        assert absences.calls == 3
        assert 2 not in leader.record.isr  # it left the in-sync set at once (its broker is not live)
        clock.step_wall(REPLACE_AFTER - 1)
        checks = absences.checks
        await ticks(clock, lambda: absences.checks >= checks + 2, "two more checks")
        assert leader.record.replicas == [1, 2, 3]  # not yet: 49 s
        clock.step_wall(1)
        await ticks(clock, lambda: 4 in leader.record.replicas, "replaced once the wait is over")
    finally:
        await leader.close("test over")
        await wal.close()


def test_a_clock_goes_when_its_broker_is_back_or_no_replica_names_it() -> None:
    absent = {2: 10.0, 5: 20.0, 7: 30.0}
    # 2 is back; 5 is still gone and still a replica somewhere; 7 was replaced everywhere.
    assert clocks_to_forget(absent, live={1, 2, 3}, named={1, 2, 3, 5}) == [2, 7]
    assert clocks_to_forget({}, live={1}, named={1}) == []


async def test_a_clock_set_back_restarts_the_wait_instead_of_stretching_it(tmp_path: Path) -> None:
    clock = wall_clock()
    # Broker 2's absence was stamped by a clock an hour ahead of this one (or this one was set back).
    absences = Absences({2: clock.time() + 3_600})
    leader, wal = await leader_with(tmp_path, absences, clock)
    try:
        checks = absences.checks
        await ticks(clock, lambda: absences.checks >= checks + 2, "two checks")
        assert leader.record.replicas == [1, 2, 3]
        clock.step_wall(REPLACE_AFTER)  # one wait from now, not an hour and a wait
        await ticks(clock, lambda: 4 in leader.record.replicas, "replaced a wait after the jump")
    finally:
        await leader.close("test over")
        await wal.close()
