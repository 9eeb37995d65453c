"""The admin API's view of placement: who owns what, the brokers, replicas, drain and balance.

Separate from the data path's `Placement`: the admin API asks these, the broker's request path never does.
Standalone answers for its single broker (broker/standalone.py); cluster/placement_admin.py reads the
cluster's metadata.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ister.core.cluster.health import ClusterHealth
    from ister.core.cluster.load import LoadReport
    from ister.core.cluster.rebalance import Move
    from ister.core.replication import CopyEnd, Recovery, Survey
    from ister.metadata.topic_index import Assignments
from ister.ids import TopicName

# Roles and the "no leader" answer of the admin API's broker listing (Danube's strings).
LEADER_ROLE = "Cluster_Leader"
FOLLOWER_ROLE = "Cluster_Follower"
NO_ROLE = "None"


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


class PlacementAdmin(Protocol):
    # -- owners and replicas ------------------------------------------------------------------------------
    async def owners(self, names: list[TopicName]) -> dict[str, int | None]:
        """Owner broker of each topic (None: waiting for an owner)."""

    async def owners_by_name(self, names: list[str]) -> dict[str, int | None]:
        """As `owners`, for full names already checked (the topic listing's 100,000 names)."""

    async def owner(self, name: TopicName) -> int | None: ...

    def owner_index(self) -> Assignments | None:
        """The owners as the broker's watch of the assignments mirrors them (cluster mode), for the topic
        listing's pages and counts; None: standalone, where this broker owns every topic."""

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

    # -- brokers ------------------------------------------------------------------------------------------
    async def broker_topics(self, broker_id: int) -> list[str]:
        """Topics assigned to a broker (NotFound: no such broker)."""

    async def leader(self) -> int | None: ...

    async def brokers(self) -> list[BrokerInfo]: ...

    async def admin_addr_of(self, broker_id: int) -> str: ...

    async def drain(self, broker: str, dry_run: bool) -> DrainPlan: ...

    async def activate(self, broker: str, reason: str) -> None: ...

    # -- balance ------------------------------------------------------------------------------------------
    async def balance(self) -> ClusterBalance: ...

    async def load_reports(self) -> list[LoadReport]:
        """Every live broker's latest load report, by id (an empty one where none was written yet)."""

    async def rebalance(self, dry_run: bool, max_moves: int | None) -> RebalanceResult: ...

    async def cluster_health(self, max_moves: int) -> ClusterHealth:
        """Recent moves, failed moves, under-replicated and under-min-ISR topics (core/cluster/health.py)."""
