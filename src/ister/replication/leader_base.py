"""A replica leader's shared state (leader.py): the replica record, the commit, the publishes waiting for
it, and fencing. `insync.py` keeps the in-sync set on it; `leader.py` answers the followers' streams."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections.abc import Awaitable, Callable

from ister.clock import REAL_CLOCK, Clock
from ister.core.replication import (
    EpochHistory,
    LeaderState,
    ReplicaRecord,
)
from ister.errors import (
    Unavailable,
)
from ister.ids import TopicName
from ister.metadata.store import MetadataStore
from ister.storage.wal import Wal, WalReader
from ister.tasks import TaskSupervisor

log = logging.getLogger(__name__)


class LeaderBase:
    def __init__(
        self,
        name: TopicName,
        wal: Wal,
        history: EpochHistory,
        record: ReplicaRecord,
        version: int,
        store: MetadataStore,
        broker_id: int,
        max_lag_s: float,
        *,
        known_committed: int = 0,
        on_fenced: Callable[[str], None] | None = None,
        on_closed: Callable[[], None] | None = None,
        peers: Callable[[], tuple[set[int], set[int]]] | None = None,
        choose: Callable[[set[int]], list[int]] | None = None,
        replace_after_s: float = 120.0,
        live: Callable[[], set[int]] | None = None,
        clock: Clock = REAL_CLOCK,
        absences: Callable[[], dict[int, float]] | None = None,
        note_absent: Callable[[dict[int, float], bool], Awaitable[None]] | None = None,
        on_step_down: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.name = name
        self.wal = wal
        self.history = history
        self.record = record
        self.version = version
        self.store = store
        self.broker_id = broker_id
        self.max_lag_s = max_lag_s
        self._clock = clock
        self._on_fenced = on_fenced
        self._on_closed = on_closed
        self._peers = peers  # (live brokers, active brokers) as the cluster view shows them
        self._live = live  # registered brokers, cheap to ask often
        self._choose = choose  # brokers for a new follower, best first, none of the given ones
        self.replace_after_s = replace_after_s
        # Broker -> wall-clock time it was first seen gone. Kept in metadata (`absences`, `note_absent`) so
        # that the replacement deadline survives a change of leader: under continuing faults a leader kept
        # in memory never lasted the whole wait. Without them, this leader's own memory.
        self._absences = absences
        self._note_absent = note_absent
        self._absent_since: dict[int, float] = {}
        self._on_step_down = on_step_down  # hands the topic back for a failover (its disk failed here)
        self._peers_checked = float("-inf")
        # Followers' streams (ended when this leader closes) and what each has sent: frames below all
        # of them are dropped.
        self._sent: dict[WalReader, int] = {}
        followers = [r for r in record.replicas if r != broker_id]
        self.state = LeaderState.take_over(
            record.epoch, wal.durable_offset, known_committed, clock.monotonic(), followers
        )
        self.fenced: str | None = None
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []  # heap of (end, seq, future)
        self._seq = itertools.count()
        self._tasks = TaskSupervisor(f"replica leader {name.full}")  # the in-sync checks
        self._isr_changed = asyncio.Event()
        self.last_fetch: dict[int, float] = dict.fromkeys(followers, clock.monotonic())
        # In-sync members that stopped following but cannot leave (the set would fall below the
        # minimum): nothing commits while there are any, so publishes are refused at once.
        self.stalled: list[int] = []
        wal.cap_visible(self.state.committed)

    @property
    def epoch(self) -> int:
        return self.record.epoch

    @property
    def committed(self) -> int:
        return self.state.committed

    def _release_waiters(self) -> None:
        committed = self.state.committed
        waiters = self._waiters
        while waiters and waiters[0][0] <= committed:
            _, _, future = heapq.heappop(waiters)
            if not future.done():
                future.set_result(None)

    def _fail_waiters(self, exc: Exception) -> None:
        waiters, self._waiters = self._waiters, []
        for _, _, future in waiters:
            if not future.done():
                future.set_exception(type(exc)(str(exc)))

    def _advance(self) -> None:
        """Move the commit to what every in-sync member holds (never with fewer than the minimum)."""
        record = self.record
        if len(record.isr) < record.min_insync or self.fenced is not None:
            return
        self.state.appended(self.wal.durable_offset, self._clock.monotonic())
        before = self.state.committed
        self.state.advance(record.isr, self.broker_id, self.wal.durable_offset)
        if self.state.committed != before:
            self.wal.cap_visible(self.state.committed)
            self._release_waiters()

    def fence(self, reason: str) -> None:
        if self.fenced is None:
            self.fenced = reason
            log.warning("%s: replication fenced: %s", self.name, reason)
            for reader in list(self._sent):
                reader.close()
            self._fail_waiters(Unavailable(f"topic {self.name} is no longer led here ({reason})"))
            if self._on_fenced is not None:
                self._on_fenced(reason)
