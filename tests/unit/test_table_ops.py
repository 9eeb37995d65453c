"""broker.table_ops: the orphan sweep's schedule and counting, the committer's wait that retention ends,
and a deleted topic's table moved out of the way of a new topic of the same name (virtual time, fake
table calls: the table work itself is tested in test_tables_sweep.py and the integration tests)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ister.broker import table_ops
from ister.broker.table_ops import OrphanSweeper, follow_incarnation, nap
from ister.clock import VirtualClock
from ister.config import TablesSettings
from ister.errors import Unavailable
from ister.tables.committer import TableState
from ister.tables.sweep import SweepResult


def count(result: str) -> float:
    return table_ops.orphan_sweeps.labels(result)._value.get()  # type: ignore[no-any-return]


def deleted() -> float:
    return table_ops.orphan_files_deleted._value.get()  # type: ignore[no-any-return]


class Calls:
    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.seen: list[tuple[Any, ...]] = []

    async def __call__(self, *args: Any) -> Any:
        self.seen.append(args)
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer


async def test_sweeps_at_first_then_every_interval_and_counts() -> None:
    clock = VirtualClock()
    settings = TablesSettings(orphan_sweep_interval_seconds=60, orphan_min_age_seconds=5)
    sweeper = OrphanSweeper(settings, clock)
    calls = Calls(SweepResult(["a", "b"]), SweepResult([]))
    ok, gone = count("ok"), deleted()
    assert await sweeper.maybe(calls, "t") == 2
    assert calls.seen == [("sweep", 5)]
    await clock.advance(59)
    assert await sweeper.maybe(calls, "t") is None  # not due
    await clock.advance(1)
    assert await sweeper.maybe(calls, "t") == 0
    assert count("ok") == ok + 2 and deleted() == gone + 2


async def test_a_failed_listing_or_deletion_is_counted_and_retried_next_interval() -> None:
    clock = VirtualClock()
    sweeper = OrphanSweeper(TablesSettings(orphan_sweep_interval_seconds=10), clock)
    calls = Calls(
        OSError("connection refused"), SweepResult(["a"], "could not delete 1 of 2"), SweepResult([])
    )
    failed, gone = count("failed"), deleted()
    assert await sweeper.maybe(calls, "t") is None
    assert sweeper.last_error is not None and "connection refused" in sweeper.last_error
    assert await sweeper.maybe(calls, "t") is None  # not due again yet
    await clock.advance(10)
    assert await sweeper.maybe(calls, "t") is None  # one deleted, one could not be
    assert count("failed") == failed + 2 and deleted() == gone + 1
    await clock.advance(10)
    assert await sweeper.maybe(calls, "t") == 0 and sweeper.last_error is None


async def test_nap_ends_when_woken_or_when_its_time_is_up() -> None:
    clock = VirtualClock()
    wake = asyncio.Event()
    napping = asyncio.create_task(nap(clock, wake, 3600))
    await clock.advance(5)
    assert not napping.done()
    wake.set()  # retention moved the start offset
    await asyncio.wait_for(napping, 1)
    assert not wake.is_set()
    wake.set()  # woken during a pass: the next wait ends at once
    await asyncio.wait_for(nap(clock, wake, 3600), 1)
    timed = asyncio.create_task(nap(clock, wake, 30))
    await clock.advance(30)
    await asyncio.wait_for(timed, 1)


async def test_follow_incarnation() -> None:
    stamped = TableState(end=300, epoch=1, snapshot_id=1, topic=7)
    calls = Calls("events-deleted-7")
    assert not await follow_incarnation(calls, "/ns/events", "events", 7, stamped)  # the same topic
    assert not await follow_incarnation(calls, "/ns/events", "events", 9, TableState(300, 1, 1))  # no stamp
    assert calls.seen == []
    assert await follow_incarnation(calls, "/ns/events", "events", 9, stamped)
    assert calls.seen == [("retire", "events-deleted-7")]
    with pytest.raises(Unavailable, match="revision"):  # the mirror has not seen the topic yet: wait
        await follow_incarnation(calls, "/ns/events", "events", None, stamped)
    failing = Calls(RuntimeError("catalog down"))
    with pytest.raises(RuntimeError):  # the pass fails and is retried; nothing was renamed
        await follow_incarnation(failing, "/ns/events", "events", 9, stamped)
