"""Composition root: build the broker from its configuration, run it, shut it down gracefully."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import uvloop

from ister.broker.health import Health, ReadyProbe, json_body, metadata_probe
from ister.broker.heap import HeapKeeper
from ister.broker.partition_share import SharedGroups
from ister.broker.service import BrokerService
from ister.broker.stall_watch import StallWatch
from ister.broker.standalone import StandaloneMode
from ister.cluster.mode import ClusterMode
from ister.config import BrokerConfig
from ister.limits import SHUTDOWN_GRACE_SECONDS
from ister.metadata import keys
from ister.metadata.embedded import EmbeddedStore
from ister.metadata.store import MetadataStore
from ister.ports.placement import Placement
from ister.ports.placement_admin import PlacementAdmin
from ister.security.peer import PeerSecret
from ister.server.admin_api import start_admin_server
from ister.server.grpc_server import start_client_server, start_prometheus
from ister.server.replica_api import LeaderLookup
from ister.server.security import Security, start_security
from ister.startwait import Waiting, unless_stopped, wait_for
from ister.storage.topic_storage import TopicStorage
from ister.tasks import TaskSupervisor

log = logging.getLogger("ister")


class Mode(Protocol):
    """One mode's parts (broker/standalone.py, cluster/mode.py), plugged into the broker and the servers."""

    @property
    def placement(self) -> Placement: ...

    @property
    def placement_admin(self) -> PlacementAdmin: ...

    @property
    def replica_leaders(self) -> LeaderLookup | None:
        """The replicated topics led here, whose followers' streams the client port serves."""

    @property
    def partition_lease(self) -> Callable[[], int | None] | None:
        """The lease partition groups shared across brokers are written under (None: kept here)."""

    def readiness_probes(self) -> list[tuple[str, ReadyProbe]]: ...


def build_mode(
    config: BrokerConfig, store: MetadataStore, storage: TopicStorage, data_dir: Path, peer: PeerSecret
) -> Mode:
    if config.mode == "cluster":
        return ClusterMode(config, store, storage, data_dir, peer)
    return StandaloneMode(config, store)


async def open_store(config: BrokerConfig, data_dir: Path) -> MetadataStore:
    if config.mode == "standalone":
        return await EmbeddedStore.open(data_dir / "metadata")
    from ister.metadata.etcd import EtcdStore
    from ister.server.tls import etcd_tls

    c = config.cluster
    return await EtcdStore.connect(c.etcd_endpoints, namespace=c.etcd_namespace, tls=etcd_tls(c.etcd_tls))


def _where_etcd(config: BrokerConfig) -> str:
    scheme = "https" if config.cluster.etcd_tls.enabled else "http"
    return ", ".join(e if "://" in e else f"{scheme}://{e}" for e in config.cluster.etcd_endpoints)


async def reach_dependencies(
    config: BrokerConfig, data_dir: Path, health: Health
) -> tuple[MetadataStore, TopicStorage]:
    """The metadata store and the storage, once etcd (cluster mode) and the object store (when there is
    a durable tier) answer: each first reach is retried until `start_timeout_seconds` (ister/startwait.py)."""

    def show(waiting: Waiting | None) -> None:
        health.waiting = waiting.describe() if waiting is not None else None

    timeout = config.start_timeout_seconds
    if config.mode == "cluster":
        store = await wait_for(
            "etcd", _where_etcd(config), lambda: open_store(config, data_dir), timeout=timeout, on_wait=show
        )
    else:
        store = await open_store(config, data_dir)
    try:
        storage = TopicStorage(config, store, data_dir)
        objects = storage.objects
        if objects is not None:
            await wait_for("the object store", objects.url, objects.probe, timeout=timeout, on_wait=show)
    except BaseException:
        await store.close()
        raise
    return store, storage


async def serve(config: BrokerConfig, data_dir: Path) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runtime = TaskSupervisor("broker runtime")  # the process's own loops: heap keeper, stall watch, health
    stall_watch = StallWatch()
    runtime.spawn(stall_watch.run(), "stall-watch")
    health = Health(lambda: stall_watch.last_beat, [])
    prom = None
    try:
        # The metrics port answers first: /readyz says what the broker waits for while it waits.
        if config.prom_exporter:
            tls = config.security.tls
            prom = start_prometheus(
                config.prom_exporter,
                per_topic=config.metrics.per_topic,
                max_topics=config.metrics.max_topics,
                tls=tls.for_port("metrics"),
                bearer_token_file=config.security.metrics.bearer_token_file,
                routes={
                    "/healthz": lambda: json_body(health.live()),
                    "/readyz": lambda: json_body(health.ready()),
                },
            )
        reached = await unless_stopped(reach_dependencies(config, data_dir, health), stop)
        if reached is None:
            log.info("stopped while waiting for dependencies")
            return
        store, storage = reached
        await _serve_broker(config, data_dir, store, storage, health, runtime, stop)
    finally:
        health.stopping = True  # /readyz says so while the metrics port is still open
        await runtime.close()
        if prom is not None:
            prom.shutdown()
    log.info("stopped")


async def _serve_broker(
    config: BrokerConfig,
    data_dir: Path,
    store: MetadataStore,
    storage: TopicStorage,
    health: Health,
    runtime: TaskSupervisor,
    stop: asyncio.Event,
) -> None:
    peer = PeerSecret()  # cluster mode: how brokers prove themselves to each other (replication)
    mode = build_mode(config, store, storage, data_dir, peer)
    placement = mode.placement
    broker = BrokerService(config, store, data_dir, placement, storage, mode.placement_admin)
    server = None
    admin = None
    security: Security | None = None
    heap = HeapKeeper(lambda: (broker.long_lived_growth, broker.topics_unloaded))
    runtime.spawn(heap.run(), "heap-keeper")
    health.add_probes([("metadata", metadata_probe(store, keys.LEADER)), *mode.readiness_probes()])
    try:
        await broker.start()
        security = await start_security(config, broker, peer)
        tls = config.security.tls
        server = await start_client_server(
            broker,
            config.broker_addr,
            tls=tls.for_port("client"),
            interceptors=security.interceptors,
            api_keys=security.api_keys,
            replica_leaders=mode.replica_leaders,
        )
        admin = await start_admin_server(
            broker,
            config.admin_addr,
            security.rbac,
            tls=tls.for_port("admin"),
            interceptors=security.interceptors,
            api_keys=security.api_keys,
        )
        lease = mode.partition_lease
        if lease is not None:  # one partition group per subscription, across brokers
            broker.consumer_refs.partition_groups.share(SharedGroups(store, placement.broker_id, lease))
        # After the server is up: the cluster's watcher may load topics and redirect clients here at once.
        await placement.start()
        await health.check_once()  # the first answer of /readyz is a real one
        health.started = True
        runtime.spawn(health.run(), "health")
        log.info(
            "ister broker ready: %s mode, client %s, data %s, fsync %s, broker id %d",
            config.mode,
            config.broker_url,
            data_dir,
            config.wal.fsync,
            placement.broker_id,
        )
        await stop.wait()
        log.info("shutting down")
    finally:
        health.stopping = True
        await runtime.close()
        broker.end_streams()
        if admin is not None:
            await admin.stop(grace=0.5)
        if server is not None:
            await server.stop(grace=1.0)
        if security is not None:
            await security.close()
        try:
            await asyncio.wait_for(broker.close(), SHUTDOWN_GRACE_SECONDS)
        except TimeoutError:
            log.error("shutdown did not finish within %.0f s", SHUTDOWN_GRACE_SECONDS)
        # Leaves the cluster (revokes the lease) last: cursors were flushed while still the owner.
        try:
            await asyncio.wait_for(placement.close(), SHUTDOWN_GRACE_SECONDS)
        except TimeoutError:
            log.error("leaving the cluster did not finish within %.0f s", SHUTDOWN_GRACE_SECONDS)
        await store.close()


def run(config: BrokerConfig) -> None:
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    data_dir = Path(config.data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    # The WAL writer thread must get the GIL back quickly after each fsync to complete the waiting appends;
    # with CPython's default 5 ms switch interval a busy event loop delays every group commit by up to 5 ms.
    sys.setswitchinterval(0.0005)
    uvloop.run(serve(config, data_dir))
