"""Who may serve a topic: the one interface standalone and cluster mode both implement.

The broker never asks which mode it runs in. It asks its `Ownership` whether a topic is served here, where
it is served otherwise, to claim a topic it loads (the claim fences every append and every owner-only
metadata write), to move a topic away, and (for the admin API) who owns what. `StandaloneOwnership`
(broker/standalone.py) serves everything here; the cluster's implementation lives in cluster/ and is wired
in by app.py, so broker/ never imports cluster/.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ister.core.cluster.load import LoadReport
    from ister.core.cluster.rebalance import Move
    from ister.core.replication import CopyEnd, Recovery, Survey
    from ister.ids import TopicName
    from ister.storage.topic_storage import TopicStorage
    from ister.storage.wal import Wal

# Roles and the "no leader" answer of the admin API's broker listing (Danube's strings).
LEADER_ROLE = "Cluster_Leader"
FOLLOWER_ROLE = "Cluster_Follower"
NO_ROLE = "None"


class TopicStats(Protocol):
    """What the cluster's load report reads of a loaded topic (ister.broker.topic.Topic)."""

    messages_in: int
    bytes_in: int

    @property
    def producers(self) -> dict[int, Any]: ...

    @property
    def subscriptions(self) -> dict[str, Any]: ...


class TopicHost(Protocol):
    """What an ownership implementation needs from the broker service."""

    def is_loaded(self, topic: str) -> bool: ...

    def load_snapshot(self) -> Iterable[tuple[str, TopicStats, int]]: ...

    async def load_assigned(self, topic: str) -> None: ...

    async def unload(self, topic: str, reason: str) -> None: ...

    async def seal(self, topic: str, reason: str) -> None: ...

    def check_topic_room(self, count: int, what: str) -> None: ...

    def topic_lock(self, name: str) -> AbstractAsyncContextManager[None]:
        """Held while the topic is loaded or its local files are changed."""


class ReplicationGate(Protocol):
    """A replicated topic's leader (docs/replication.md): publishes are acknowledged once enough replicas
    hold them."""

    def check_writable(self) -> None:
        """Raise Unavailable when nothing could be committed now (too few in-sync replicas, fenced)."""

    def appended(self) -> None:
        """Records became durable on this broker."""

    async def wait_committed(self, end: int) -> None:
        """Return once every offset below `end` is committed (Unavailable when it cannot be here)."""

    async def hand_over(self, within: float) -> None:
        """Appends are refused already: return once every in-sync replica holds the whole log, so any of
        them can lead next without the durable tier (Unavailable when that does not happen in time)."""

    async def close(self, reason: str) -> None: ...


class TopicClaim(Protocol):
    """The fence on one loaded topic: consulted before every append and every owner-only metadata write."""

    @property
    def epoch(self) -> int: ...

    @property
    def replication(self) -> ReplicationGate | None:
        """The topic's replication leader, None for a topic with one copy."""

    def check(self, count: int = 1) -> None:
        """Raise Fenced unless this broker may append `count` records now."""

    def appended(self) -> None:
        """Records were appended (a claim with offset reservations may extend its reservation)."""

    def revoke(self, reason: str) -> None:
        """Nothing lands through this claim any more (idempotent)."""

    async def guarded_put(self, key: str, value: object) -> None:
        """A metadata write that lands only while this broker owns the topic (else Fenced)."""


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    broker_id: int
    broker_url: str
    admin_addr: str
    metrics_addr: str
    role: str
    status: str  # active, draining or drained


@dataclass(frozen=True, slots=True)
class DrainPlan:
    started: bool
    total: int  # topics on the broker when the drain was asked for
    pending: int


@dataclass(frozen=True, slots=True)
class BrokerLoad:
    broker_id: int
    load: float
    topic_count: int
    overloaded: bool
    underloaded: bool


@dataclass(frozen=True, slots=True)
class ClusterBalance:
    coefficient_of_variation: float
    mean_load: float
    max_load: float
    min_load: float
    std_deviation: float
    broker_count: int
    brokers: list[BrokerLoad]
    strategy: str


@dataclass(frozen=True, slots=True)
class RebalanceResult:
    executed: int
    moves: list[Move]
    detail: str


class Ownership(Protocol):
    @property
    def broker_id(self) -> int: ...

    @property
    def moves_need_export(self) -> bool:
        """A seal must first put the topic's records where the next owner reads them (True in a cluster;
        standalone reloads the same WAL)."""

    def bind(self, host: TopicHost) -> None:
        """The broker service this ownership serves (called once, by the service's constructor)."""

    async def start(self) -> None:
        """Begin (cluster: join, after the servers are up, since the watcher may load topics at once)."""

    async def close(self) -> None:
        """End (cluster: leave last, once cursors were flushed as the owner)."""

    # -- serving ----------------------------------------------------------------------------------------
    def serves(self, topic: str) -> bool:
        """The topic is assigned to this broker (it may load it now)."""

    async def ensure_served_here(self, name: TopicName) -> None:
        """Wait briefly for an owner; raise Unavailable (redo the lookup) unless it is this broker."""

    async def locate(self, name: TopicName) -> str | None:
        """URL of the broker serving an existing topic, None when it is this one (Unavailable meanwhile)."""

    def not_served_error(self, what: str) -> Exception:
        """The error for a call about something this broker does not serve (NotFound or Unavailable)."""

    async def topics_created(self, names: list[TopicName]) -> None:
        """New topics' metadata was written: place them (cluster: queue them for the leader)."""

    def check_room_for_new(self, count: int, what: str) -> None:
        """Raise ResourceExhausted before anything is written when new topics would load here over the
        broker's topic limit (only when they are loaded here at once)."""

    @property
    def loads_new_topics_here(self) -> bool:
        """An admin creation loads the topics here at once (else the placement decides later)."""

    # -- claiming -----------------------------------------------------------------------------------------
    async def open_reliable(self, name: TopicName, storage: TopicStorage) -> tuple[Wal, TopicClaim]:
        """Open the topic's WAL where its offsets must continue, and claim it."""

    async def claim_volatile(self, name: TopicName) -> TopicClaim:
        """Claim a non-reliable topic (no WAL)."""

    async def request_unload(self, name: TopicName) -> None:
        """Admin unload: move the topic away (standalone: seal it here; it reloads on next use)."""

    async def topic_deleted(self, name: TopicName) -> None:
        """Its metadata is going: let go of it (cluster: delete its assignment so the owner fences it)."""

    # -- the admin API's view ------------------------------------------------------------------------------
    async def owners(self, names: list[TopicName]) -> dict[str, int | None]:
        """Owner broker of each topic (None: waiting for an owner)."""

    async def owner(self, name: TopicName) -> int | None: ...

    def replica_lag(self, topic: str) -> dict[int, int] | None:
        """Follower -> records it lacks, for a replicated topic this broker leads (else None)."""

    def local_copy(self, topic: str) -> CopyEnd | None:
        """This broker's copy of a replicated topic (None: none open here, or standalone)."""

    async def recovery_survey(self, name: TopicName) -> Survey:
        """A replicated topic found without a live in-sync replica (else FailedPrecondition / NotFound)."""

    async def recovery_plan(self, name: TopicName, found: Survey, copies: dict[int, CopyEnd]) -> Recovery:
        """What an unclean recovery would do now (cluster/recovery.py)."""

    async def write_recovery(self, name: TopicName, found: Survey, recovery: Recovery) -> None:
        """Start it: the chosen broker alone in sync, resuming at `recovery.resume_at`."""

    async def broker_topics(self, broker_id: int) -> list[str]:
        """Topics assigned to a broker (NotFound: no such broker)."""

    async def leader(self) -> int | None: ...

    async def brokers(self) -> list[BrokerInfo]: ...

    async def admin_addr_of(self, broker_id: int) -> str: ...

    async def drain(self, broker: str, dry_run: bool) -> DrainPlan: ...

    async def activate(self, broker: str, reason: str) -> None: ...

    async def balance(self) -> ClusterBalance: ...

    async def load_reports(self) -> list[LoadReport]:
        """Every live broker's latest load report, by id (an empty one where none was written yet)."""

    async def rebalance(self, dry_run: bool, max_moves: int | None) -> RebalanceResult: ...
