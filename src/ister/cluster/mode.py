"""Cluster mode's parts, built for the composition root (app.py) to plug into the broker's ports."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ister.cluster.health import cluster_checks
from ister.cluster.node import ClusterNode
from ister.cluster.placement import ClusterPlacement
from ister.cluster.placement_admin import ClusterAdmin
from ister.cluster.replicated import ReplicatedTopics
from ister.config import BrokerConfig
from ister.metadata.store import MetadataStore
from ister.ports.health import ReadyProbe
from ister.replication.leader import ReplicaLeader
from ister.security.peer import PeerSecret
from ister.storage.topic_storage import TopicStorage


class ClusterMode:
    def __init__(
        self,
        config: BrokerConfig,
        store: MetadataStore,
        storage: TopicStorage,
        data_dir: Path,
        peer: PeerSecret | None = None,
    ) -> None:
        self.node = ClusterNode(config, store, data_dir)
        self.replicated = ReplicatedTopics(self.node, config, store, storage, peer)
        self.node.followed = self.replicated.manager.followed
        self.placement = ClusterPlacement(self.node, config, store, storage, self.replicated)
        self.placement_admin = ClusterAdmin(self.node, store, self.replicated)

    def readiness_probes(self) -> list[tuple[str, ReadyProbe]]:
        node = self.node
        return [("cluster", lambda: cluster_checks(node))]

    @property
    def replica_leaders(self) -> Callable[[str], ReplicaLeader | None]:
        """The replicated topics this broker leads (their followers' streams are served here)."""
        return self.replicated.manager.leaders.get

    @property
    def partition_lease(self) -> Callable[[], int | None]:
        """One partition group per subscription across brokers, its keys under this broker's lease."""
        membership = self.node.membership
        return lambda: membership.lease_id
