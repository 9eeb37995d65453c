"""Placement of a standalone broker: it is the only broker, so it serves every topic, claims never
conflict, and a move is a seal followed by a reload here on next use. Its admin view answers for itself."""

from __future__ import annotations

from ister.config import BrokerConfig, http_url
from ister.core.cluster.health import ClusterHealth
from ister.core.cluster.load import LoadReport
from ister.core.replication import CopyEnd, Recovery, Survey
from ister.errors import FailedPrecondition, Fenced, NotFound
from ister.ids import TopicName
from ister.metadata import keys
from ister.metadata.records import SealedState
from ister.metadata.store import KeyValue, MetadataStore, list_all
from ister.metadata.topic_index import Assignments
from ister.ports.health import ReadyProbe
from ister.ports.host import TopicHost
from ister.ports.placement import LogPlan
from ister.ports.placement_admin import LEADER_ROLE, BrokerInfo, ClusterBalance, DrainPlan, RebalanceResult
from ister.storage.topic_log import LogStart, OpenedLog
from ister.storage.wal import Wal

STANDALONE_BROKER_ID = 0
_STANDALONE = "a standalone broker is the only broker"


class LocalClaim:
    """A standalone topic's claim: only its own revocation (a seal) fences it."""

    __slots__ = ("revoked", "store", "topic")

    def __init__(self, topic: str, store: MetadataStore) -> None:
        self.topic = topic
        self.store = store
        self.revoked: str | None = None

    @property
    def epoch(self) -> int:
        return 0

    @property
    def replication(self) -> None:
        return None

    def check(self, count: int = 1) -> None:
        if self.revoked is not None:
            raise Fenced(f"topic {self.topic} is no longer served here ({self.revoked}); redo the lookup")

    def appended(self) -> None:
        return None

    def revoke(self, reason: str) -> None:
        if self.revoked is None:
            self.revoked = reason

    async def guarded_put(self, key: str, value: object) -> None:
        await self.store.put(key, value)


class StandalonePlacement:
    def __init__(self, config: BrokerConfig, store: MetadataStore) -> None:
        self.config = config
        self.store = store
        self._host: TopicHost | None = None

    @property
    def broker_id(self) -> int:
        return STANDALONE_BROKER_ID

    @property
    def moves_need_export(self) -> bool:
        return False

    @property
    def loads_new_topics_here(self) -> bool:
        return True

    def bind(self, host: TopicHost) -> None:
        self._host = host

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    # -- serving ----------------------------------------------------------------------------------------
    def serves(self, topic: str) -> bool:
        return True

    async def ensure_served_here(self, name: TopicName) -> None:
        return None

    async def locate(self, name: TopicName) -> str | None:
        return None

    def not_served_error(self, what: str) -> Exception:
        return NotFound(f"{what} does not exist on this broker")

    async def topics_created(self, names: list[TopicName]) -> None:
        return None

    def check_room_for_new(self, count: int, what: str) -> None:
        assert self._host is not None
        self._host.check_topic_room(count, what)

    # -- claiming ---------------------------------------------------------------------------------------
    async def plan_log(self, name: TopicName) -> LogPlan:
        """The local WAL, continued; after a seal (admin unload) it starts no lower than the sealed end."""
        kv = await self.store.get(keys.storage_state(name.full))
        sealed = SealedState.parse(kv.value) if kv is not None else None
        return LogPlan(LogStart.standalone(sealed), kv)

    async def claim_log(
        self, name: TopicName, plan: LogPlan, opened: OpenedLog | None
    ) -> tuple[Wal, LocalClaim]:
        assert opened is not None  # the plan always has a start here
        kv = plan.context
        if isinstance(kv, KeyValue):  # the seal is consumed: the next load must not trust it again
            await self.store.compare_and_delete(kv.key, expected_version=kv.version)
        return opened.wal, LocalClaim(name.full, self.store)

    async def claim_volatile(self, name: TopicName) -> LocalClaim:
        return LocalClaim(name.full, self.store)

    async def request_unload(self, name: TopicName) -> None:
        assert self._host is not None
        await self._host.seal(name.full, "admin unload")

    async def topic_deleted(self, name: TopicName) -> None:
        return None


class StandaloneAdmin:
    """The admin API's view of a standalone broker: broker 0 owns everything; cluster operations are
    refused with a reason."""

    def __init__(self, config: BrokerConfig, store: MetadataStore) -> None:
        self.config = config
        self.store = store

    async def owners(self, names: list[TopicName]) -> dict[str, int | None]:
        return {n.full: STANDALONE_BROKER_ID for n in names}

    async def owners_by_name(self, names: list[str]) -> dict[str, int | None]:
        return dict.fromkeys(names, STANDALONE_BROKER_ID)

    def owner_index(self) -> Assignments | None:
        return None

    def replica_lag(self, topic: str) -> dict[int, int] | None:
        return None  # one copy

    def local_copy(self, topic: str) -> CopyEnd | None:
        return None

    async def recovery_survey(self, name: TopicName) -> Survey:
        raise FailedPrecondition(
            f"{_STANDALONE}: it keeps one copy of each topic on its disk; there are no replicas to recover"
        )

    async def recovery_plan(self, name: TopicName, found: Survey, copies: dict[int, CopyEnd]) -> Recovery:
        raise FailedPrecondition(_STANDALONE)

    async def write_recovery(self, name: TopicName, found: Survey, recovery: Recovery) -> None:
        raise FailedPrecondition(_STANDALONE)

    async def owner(self, name: TopicName) -> int | None:
        return STANDALONE_BROKER_ID

    async def broker_topics(self, broker_id: int) -> list[str]:
        if broker_id != STANDALONE_BROKER_ID:
            raise NotFound(f"broker {broker_id} does not exist (standalone: the only broker is 0)")
        names: list[str] = []
        for ns in keys.namespace_names(kv.key for kv in await list_all(self.store, keys.NAMESPACES_PREFIX)):
            listing = await list_all(self.store, keys.namespace_topics_prefix(ns))
            names.extend(keys.topics_in_namespace((kv.key for kv in listing), ns))
        return names

    async def leader(self) -> int | None:
        return STANDALONE_BROKER_ID

    async def brokers(self) -> list[BrokerInfo]:
        c = self.config
        return [
            BrokerInfo(
                STANDALONE_BROKER_ID,
                c.broker_url,
                http_url(c.admin_addr),
                c.prom_exporter or "",
                LEADER_ROLE,
                "active",
            )
        ]

    async def admin_addr_of(self, broker_id: int) -> str:
        return http_url(self.config.admin_addr)

    async def drain(self, broker: str, dry_run: bool) -> DrainPlan:
        raise FailedPrecondition(f"{_STANDALONE}: drain exists in cluster mode only")

    async def activate(self, broker: str, reason: str) -> None:
        raise FailedPrecondition(f"{_STANDALONE}: it is always active (drain exists in cluster mode only)")

    async def balance(self) -> ClusterBalance:
        raise FailedPrecondition(f"{_STANDALONE}: cluster balance exists in cluster mode only")

    async def rebalance(self, dry_run: bool, max_moves: int | None) -> RebalanceResult:
        raise FailedPrecondition(f"{_STANDALONE}: rebalancing exists in cluster mode only")

    async def cluster_health(self, max_moves: int) -> ClusterHealth:
        # What applies to one broker holding one copy of every topic: nothing moves, nothing is replicated.
        note = (
            f"{_STANDALONE}: it holds the only copy of every topic, so no topic moves or is replicated; "
            "rebalancing, failed moves and under-replicated topics exist in cluster mode only"
        )
        return ClusterHealth(mode="standalone", note=note)

    async def load_reports(self) -> list[LoadReport]:
        raise FailedPrecondition(
            f"{_STANDALONE}: load reports exist in cluster mode only (its rates are in its metrics)"
        )


class StandaloneMode:
    """What app.py plugs into the broker in standalone mode."""

    def __init__(self, config: BrokerConfig, store: MetadataStore) -> None:
        self.placement = StandalonePlacement(config, store)
        self.placement_admin = StandaloneAdmin(config, store)
        self.replica_leaders = None  # one copy of every topic: no replication stream to serve
        self.partition_lease = None  # partition groups stay on this broker

    def readiness_probes(self) -> list[tuple[str, ReadyProbe]]:
        return []
