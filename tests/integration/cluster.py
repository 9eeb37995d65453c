"""A cluster of real `ister broker --mode cluster` processes on one etcd, and ways to look inside it."""

from __future__ import annotations

import os
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
from danube.proto import DanubeApi_pb2 as dpb
from danube.proto import DanubeApi_pb2_grpc as dpb_grpc

from ister.core.cluster.ownership import OwnerRecord
from ister.devcluster.group import BrokerGroup, cluster_args
from ister.metadata import keys
from ister.metadata.etcd import EtcdStore, EtcdTls
from ister.metadata.store import Compare, Delete, Put
from tests.integration.harness import BrokerProcess
from tests.integration.network import Host, Network
from tests.support import until

WAIT = 20.0  # generous upper bound for cluster reactions (lease TTL is 2 s in these tests)
LEASE_TTL = 2
# The product's default is 3 copies per reliable topic; most cluster tests were written for (and check the
# offsets, seals and reservations of) the single-copy path, which stays a supported setting, so they ask for
# it. Replication tests pass their own `ISTER_CLUSTER__REPLICATION_FACTOR`; `TEST_CLUSTER_RF` runs
# every other cluster test at another factor, to look for what replication changes.
SINGLE_COPY = {"ISTER_CLUSTER__REPLICATION_FACTOR": os.environ.get("TEST_CLUSTER_RF", "1")}


class Cluster:
    def __init__(
        self,
        root: Path,
        etcd_endpoint: str,
        size: int,
        lease_ttl: int = LEASE_TTL,
        *extra: str,
        env: dict[str, str] | None = None,
        etcd_tls: EtcdTls | None = None,
        network: Network | None = None,
    ) -> None:
        self.etcd_tls = etcd_tls  # how the test itself reaches etcd (the brokers get theirs in `extra`)
        self.namespace = "/c" + uuid.uuid4().hex[:12]
        self.etcd_endpoint = etcd_endpoint
        env = {
            "ISTER_CLUSTER__ETCD_NAMESPACE": self.namespace,
            "ISTER_CLUSTER__LEASE_TTL_SECONDS": str(lease_ttl),
            "ISTER_LOAD_MANAGER__LOAD_REPORT_INTERVAL_SECONDS": "1",
            **SINGLE_COPY,
            **(env or {}),
        }
        args = cluster_args([etcd_endpoint], "itest", *extra)
        self.group = BrokerGroup(
            size, lambda i: BrokerProcess(root / f"b{i}", *args, env=env, **self._placement(network, i))
        )
        self.brokers = self.group.brokers
        self.network = network
        if network is not None:
            for host, b in zip(network.hosts, self.brokers, strict=True):
                network.serves(host, b.port)
        self.store: EtcdStore | None = None

    @staticmethod
    def _placement(network: Network | None, i: int) -> dict[str, Any]:
        """Broker `i` in the network's namespace `i`, on its address (none given: loopback, as always)."""
        if network is None:
            return {}
        host = network.hosts[i]
        return {"host": host.ip, "prefix": network.prefix_command(host)}

    def host_of(self, broker_id: int) -> Host:
        """The namespace of a broker of a cluster started on a `Network`."""
        assert self.network is not None
        return self.network.hosts[self.brokers.index(self.process_of(broker_id))]

    async def start(self, count: int | None = None) -> None:
        """Start the first `count` brokers (all by default); `start_more` starts the others later."""
        self.store = await EtcdStore.connect(
            [self.etcd_endpoint], namespace=self.namespace, tls=self.etcd_tls
        )
        self.group.start(count)
        await self.until(self.all_registered, "all brokers registered")

    async def start_more(self) -> None:
        self.group.start_more()
        await self.until(self.all_registered, "all brokers registered")

    @property
    def started(self) -> int:
        return self.group.started

    async def all_registered(self) -> bool:
        return len(await self.live()) == self.started

    async def stop(self) -> None:
        self.group.stop()
        if self.store is not None:
            await self.store.close()

    # -- metadata views ---------------------------------------------------------------------------------
    async def live(self) -> list[int]:
        assert self.store is not None
        return keys.broker_ids(kv.key for kv in await self.store.list(keys.REGISTER_PREFIX))

    def broker_id(self, broker: BrokerProcess) -> int:
        return int((broker.data_dir / "broker_id").read_text())

    async def leader(self) -> int | None:
        assert self.store is not None
        kv = await self.store.get(keys.LEADER)
        return kv.value if kv is not None else None

    async def assignments(self) -> dict[str, int]:
        assert self.store is not None
        return keys.assignments(kv.key for kv in await self.store.list(keys.BROKERS_PREFIX))

    async def owner_record(self, topic: str) -> OwnerRecord | None:
        assert self.store is not None
        kv = await self.store.get(keys.owner(topic))
        return OwnerRecord.parse(kv.value) if kv is not None else None

    async def unload(self, topic: str) -> None:
        """What the admin UnloadTopic does in cluster mode: ask the owner to seal and hand the topic off."""
        assert self.store is not None
        owner = (await self.assignments())[topic]
        assignment = await self.store.get(keys.broker_topic(owner, topic))
        assert assignment is not None
        ok = await self.store.txn(
            [Compare(assignment.key, assignment.version), Compare(keys.unassigned(topic), None)],
            [
                Delete(assignment.key),
                Put(keys.unassigned(topic), {"reason": "unload", "from_broker": owner, "ready": False}),
            ],
        )
        assert ok

    async def load_report(self, broker_id: int) -> Any:
        assert self.store is not None
        kv = await self.store.get(keys.load_report(broker_id))
        return kv.value if kv is not None else None

    async def sealed_state(self, topic: str) -> Any:
        assert self.store is not None
        kv = await self.store.get(keys.storage_state(topic))
        return kv.value if kv is not None else None

    def process_of(self, broker_id: int) -> BrokerProcess:
        for b in self.brokers:
            if self.broker_id(b) == broker_id:
                return b
        raise LookupError(broker_id)

    async def until(
        self, check: Callable[[], Awaitable[Any] | Any], what: str | Callable[[], str], within: float = WAIT
    ) -> Any:
        """Poll `check` (sync or async) until it returns something truthy; its value."""
        return await until(check, what, within, poll=0.05)


async def lookup(url: str, topic: str) -> tuple[str, str]:
    """('connect'|'redirect', broker_url) as the official protocol answers it."""
    async with grpc.aio.insecure_channel(url.split("://", 1)[-1]) as channel:
        stub = dpb_grpc.DiscoveryStub(channel)
        resp = await stub.TopicLookup(dpb.TopicLookupRequest(request_id=1, topic=topic), timeout=10)
    kind = "connect" if resp.response_type == dpb.TopicLookupResponse.Connect else "redirect"
    return kind, resp.broker_url
