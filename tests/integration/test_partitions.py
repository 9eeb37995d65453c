"""Network partitions under load (issue 39): three brokers, each in its own network namespace, on an etcd
and a producer in the root namespace (tests/integration/network.py); RF 3, min in-sync 2, lease TTL 2 s,
`replica_max_lag_seconds` 2, no durable tier.

Every test runs a producer across the fault and checks the acknowledged history: an offset is never
acknowledged with two payloads, and after the heal every acknowledged offset reads back with its payload
from the cluster and is held by all three copies. Each prints the unwritable stretch (the longest time
between two acknowledged batches from the fault on).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ister.client import Client
from ister.core.replication import ReplicaRecord
from tests.etcd_server import EtcdServer, etcd_binary
from tests.integration.cluster import LEASE_TTL, Cluster
from tests.integration.network import Host, Network, unavailable
from tests.integration.replication_support import RF_ENV, produce, read_all, replica_record, wal_contents

pytestmark = pytest.mark.timeout(120)  # a hang guard: each test takes well under a minute

MAX_LAG = int(RF_ENV["ISTER_CLUSTER__REPLICA_MAX_LAG_SECONDS"])
# A minority side must stop acknowledging within this of the fault: the lease or the in-sync lag, whichever
# applies, plus a few seconds for what was in flight (publishes already replicated when the fault began).
STOP_BOUND = LEASE_TTL + MAX_LAG + 4.0
HOLD = STOP_BOUND + 4.0  # how long a fault that stops writes is kept: long enough to see them stopped
RESUME_BOUND = 30.0  # after the heal, writes resume within this
FAILOVER_BOUND = 20.0  # a new leader on the majority side acknowledges within this of the fault


@pytest.fixture
def network() -> Iterator[Network]:
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    net = Network(3)
    try:
        net.create()
        yield net
    finally:
        net.close()


@pytest.fixture
def etcd_on_bridge(tmp_path: Path, network: Network) -> Iterator[EtcdServer]:
    """An etcd of the test's own on the bridge's root address, where the brokers' namespaces reach it."""
    if etcd_binary() is None:
        pytest.skip("etcd is not installed: run `make test` (installs etcd-server)")
    server = EtcdServer(tmp_path / "etcd", host=network.root_ip)
    server.start()
    network.etcd_port = server.client_port
    yield server
    server.stop()


@pytest.fixture
async def cluster(tmp_path: Path, etcd_on_bridge: EtcdServer, network: Network) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path, etcd_on_bridge.endpoint, 3, LEASE_TTL, env=RF_ENV, network=network)
    try:
        await c.start()
        yield c
    finally:
        await c.stop()


@dataclass
class Traffic:
    """A producer running across a fault, and when things happened (monotonic seconds)."""

    cluster: Cluster
    topic: str
    acked: dict[int, bytes] = field(default_factory=dict)
    acked_at: list[float] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)  # the producers, stopped by `stop`
    started: ReplicaRecord | None = None  # the replica record when the fault began
    fault_at: float = 0.0
    heal_at: float = 0.0

    @property
    def before(self) -> ReplicaRecord:
        assert self.started is not None
        return self.started

    @property
    def network(self) -> Network:
        assert self.cluster.network is not None
        return self.cluster.network

    def follower(self) -> int:
        return next(b for b in self.before.replicas if b != self.before.leader)

    @property
    def urls(self) -> list[str]:
        return [b.url for b in self.cluster.brokers]

    def host(self, broker_id: int) -> Host:
        return self.cluster.host_of(broker_id)

    async def acks_grow(self, by: int, what: str, within: float) -> float:
        """Wait until `by` more records are acknowledged; when (monotonic) that happened."""
        target = len(self.acked) + by
        await self.cluster.until(lambda: len(self.acked) >= target, what, within)
        return time.monotonic()

    def acks_between(self, start: float, end: float) -> int:
        return sum(1 for t in self.acked_at if start < t < end)

    def stretch(self) -> float:
        """The longest time without an acknowledgement, from the last one before the fault on."""
        times = [t for t in self.acked_at if t < self.fault_at][-1:] + [
            t for t in self.acked_at if t >= self.fault_at
        ]
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


async def all_in_sync(cluster: Cluster, topic: str) -> ReplicaRecord | None:
    rec = await replica_record(cluster, topic)
    return rec if rec is not None and len(rec.isr) == 3 and len(rec.replicas) == 3 else None


async def start(cluster: Cluster, topic: str) -> Traffic:
    """Traffic flowing on `topic` with all three copies in sync; the fault's clock starts now."""
    t = Traffic(cluster, topic)
    t.tasks.append(asyncio.create_task(produce(t.urls, topic, t.acked, t.stop, t.acked_at)))
    await t.acks_grow(500, "traffic flows", 30)
    t.started = await cluster.until(lambda: all_in_sync(cluster, topic), "all three copies in sync", 30)
    t.fault_at = time.monotonic()
    return t


async def heal_and_check(t: Traffic, shape: str) -> None:
    """Heal, wait for writes to resume and all copies to be in sync again, stop the producer and check the
    acknowledged history against the cluster and against each copy on disk."""
    t.network.heal()
    t.heal_at = time.monotonic()
    try:
        resumed = await t.acks_grow(200, f"{shape}: writes resume after the heal", RESUME_BOUND)
        await t.cluster.until(lambda: all_in_sync(t.cluster, t.topic), "all copies in sync again", 60)
    finally:
        t.stop.set()
        for task in t.tasks:
            await task  # re-raises an offset acknowledged with two payloads
    got = await read_all(t.urls, t.topic, max(t.acked) + 1)
    lost = [o for o in t.acked if got.get(o) != t.acked[o]]
    assert not lost, f"{len(lost)} acknowledged offsets lost or changed, first {sorted(lost)[:5]}"
    for b in t.cluster.brokers:
        b.stop()  # each copy is read from its files
    for b in t.cluster.brokers:
        copy = await wal_contents(b.data_dir, t.topic)
        bad = [o for o in t.acked if copy.get(o) != t.acked[o]]
        assert not bad, f"{b.data_dir.name}: {len(bad)} acknowledged offsets missing or changed, {bad[:5]}"
    print(
        f"\n{shape}: {len(t.acked)} acknowledged, none lost or changed; unwritable stretch "
        f"{t.stretch():.2f} s (fault held {t.heal_at - t.fault_at:.1f} s; writes resumed "
        f"{resumed - t.heal_at:.2f} s after the heal)"
    )


async def hold(seconds: float, check: Callable[[], Awaitable[None]] | None = None) -> None:
    """Keep a fault for `seconds` (the partition's length is the scenario, not a wait for an event)."""
    end = time.monotonic() + seconds
    if check is not None:
        await check()
    await asyncio.sleep(max(0.0, end - time.monotonic()))


def assert_stopped(t: Traffic) -> None:
    """Nothing was acknowledged from STOP_BOUND after the fault until the heal."""
    late = t.acks_between(t.fault_at + STOP_BOUND, t.heal_at)
    assert late == 0, f"{late} batches acknowledged more than {STOP_BOUND} s into the fault"


async def test_leader_cut_from_both_followers(cluster: Cluster) -> None:
    """a. The leader reaches etcd and clients but neither follower. Kafka: the leader cannot shrink the ISR
    below min.insync.replicas, so produces fail (NotEnoughReplicas) and the controller elects nobody (the
    leader's session is alive); Jepsen: a CP system may be unavailable, must lose nothing acknowledged.
    Ister: the leader keeps its lease, commits stop within `replica_max_lag_seconds`, no failover; after
    the heal the followers catch up and writes resume."""
    t = await start(cluster, "/default/part_leader_cut")
    leader = t.host(t.before.leader)
    for f in t.before.replicas:
        if f != t.before.leader:
            t.network.cut(leader, t.host(f))
    await hold(HOLD)
    rec = await replica_record(cluster, t.topic)
    assert rec is not None and rec.leader == t.before.leader  # no failover: the leader holds its lease
    t.heal_at = time.monotonic()
    assert_stopped(t)
    await heal_and_check(t, "leader cut from both followers")


async def test_leader_cut_from_etcd(cluster: Cluster) -> None:
    """b. The leader reaches its followers and the producer but not etcd. Kafka (ZooKeeper/KRaft): the
    leader's session expires, the controller elects an in-sync follower, and the old leader's produces fail
    once it learns it was fenced (with acks=all it cannot commit without the followers, which now follow the
    new leader). Ister: the old leader stops appending when its lease clock runs out (TTL - 1 s after its
    last renewal), the cluster leader gives the topic to an in-sync follower at the next epoch, which serves
    within the failover bound while the fault holds; the old leader rejoins as a follower after the heal."""
    t = await start(cluster, "/default/part_leader_etcd")
    # A second producer knows only the old leader: what it gets acknowledged after the old leader's lease
    # ran out would come from a broker that may no longer append (its records share the history check).
    old = cluster.process_of(t.before.leader)
    probe_at: list[float] = []
    probe = produce([old.url], t.topic, t.acked, t.stop, probe_at, Client(old.url, retry_timeout=1.0), "p")
    t.tasks.append(asyncio.create_task(probe))
    await cluster.until(lambda: probe_at, "the probe's first acknowledgement", 30)
    t.fault_at = time.monotonic()
    t.network.isolate_from_etcd(t.host(t.before.leader))

    async def replaced() -> ReplicaRecord | None:
        rec = await replica_record(cluster, t.topic)
        return (
            rec if rec is not None and rec.leader != t.before.leader and rec.epoch > t.before.epoch else None
        )

    after = await cluster.until(replaced, "an in-sync follower leads", FAILOVER_BOUND)
    served = await t.acks_grow(200, "the new leader acknowledges", FAILOVER_BOUND)
    assert after.leader in t.before.isr
    print(f"\nnew leader acknowledging {served - t.fault_at:.2f} s after the fault")
    assert served - t.fault_at < FAILOVER_BOUND
    await hold(2.0)  # the old leader keeps running cut off a little longer with traffic on the new one
    t.heal_at = time.monotonic()
    late = [x - t.fault_at for x in probe_at if t.fault_at + LEASE_TTL < x < t.heal_at]
    assert not late, f"the old leader acknowledged {len(late)} batches past its lease, first {late[0]:.2f} s"
    await heal_and_check(t, "leader cut from etcd")
    last = max((x - t.fault_at for x in probe_at if x < t.heal_at), default=float("nan"))
    print(f"the old leader's last acknowledgement: {last:.2f} s after the fault")


async def test_follower_cut_from_etcd(cluster: Cluster) -> None:
    """c. A follower hears the leader but not etcd. Kafka: the broker's session expires, the controller
    removes it from the ISR, writes go on with the others; it rejoins once back. Ister: its registration
    lapses, the leader may drop it from the in-sync set (two copies remain, the minimum), writes go on
    (at most a stall of about `replica_max_lag_seconds`); after the heal it registers again and rejoins."""
    t = await start(cluster, "/default/part_follower_etcd")
    t.network.isolate_from_etcd(t.host(t.follower()))
    await hold(LEASE_TTL + 2.0)  # past the follower's lease
    await t.acks_grow(500, "writes go on past the follower's lease", FAILOVER_BOUND)
    await heal_and_check(t, "follower cut from etcd")
    assert t.stretch() < FAILOVER_BOUND


@pytest.mark.parametrize("direction", ["leader_to_follower", "follower_to_leader"])
async def test_one_way_loss_between_leader_and_a_follower(cluster: Cluster, direction: str) -> None:
    """d. Packets one way between the leader and one follower are lost (TCP then fails both ways for their
    connections). Kafka: the follower falls out of the ISR after replica.lag.time.max.ms and writes go on
    with the others. Ister: commits wait for it at most `replica_max_lag_seconds`, then go on with two
    copies; after the heal it catches up and rejoins."""
    t = await start(cluster, f"/default/part_one_way_{direction}")
    leader = t.host(t.before.leader)
    follower = t.host(t.follower())
    src, dst = (leader, follower) if direction == "leader_to_follower" else (follower, leader)
    t.network.cut_one_way(src, dst)
    await t.acks_grow(500, "writes go on with the other follower", FAILOVER_BOUND)
    await hold(MAX_LAG + 2.0)
    await heal_and_check(t, f"one-way loss {direction.replace('_', ' ')}")
    assert t.stretch() < FAILOVER_BOUND


async def test_producer_cut_from_the_leader(cluster: Cluster) -> None:
    """e. Clients cannot reach the leader's client port; they reach the other brokers, and the brokers
    reach each other and etcd. Kafka: metadata keeps naming the healthy leader, so a client that cannot
    reach it cannot produce (no failover: the cluster sees nothing wrong). Ister the same: the other brokers
    answer lookups with the leader's address, writes wait for the heal, the in-sync set stays whole."""
    t = await start(cluster, "/default/part_client_cut")
    t.network.isolate_from_clients(t.host(t.before.leader))
    await hold(HOLD)
    rec = await replica_record(cluster, t.topic)
    assert rec is not None and rec.leader == t.before.leader and len(rec.isr) == 3
    t.heal_at = time.monotonic()
    assert_stopped(t)
    await heal_and_check(t, "producer cut from the leader")


async def test_tcp_resets_on_the_replication_path(cluster: Cluster) -> None:
    """f. Every TCP segment between the leader and its followers is answered with a reset (connections
    break at once, reconnects are refused), etcd and clients unaffected. Kafka: like a cut, fetches fail
    fast, the ISR cannot shrink below min.insync.replicas, produces fail. Ister: publishes are refused
    (`UNAVAILABLE`) once the followers count as stopped; no failover; after the heal the streams reconnect
    and writes resume."""
    t = await start(cluster, "/default/part_resets")
    leader = t.host(t.before.leader)
    for f in t.before.replicas:
        if f != t.before.leader:
            t.network.reset(leader, t.host(f))
    await hold(HOLD)
    t.heal_at = time.monotonic()
    assert_stopped(t)
    await heal_and_check(t, "TCP resets leader <-> followers")


async def test_leader_alone_with_the_clients(cluster: Cluster) -> None:
    """g. The leader is cut from both followers and from etcd; only clients reach it (the classic minority
    partition with clients on both sides). Kafka: its session expires, the controller elects an in-sync
    follower; the old leader cannot commit with acks=all, so a producer there gets errors until its
    metadata names the new leader. Ister: the old leader commits nothing (no follower), its lease runs
    out, the majority side's new leader serves the producer (which knows every broker) within the
    failover bound while the fault holds; after the heal the old leader's uncommitted suffix is cut."""
    t = await start(cluster, "/default/part_leader_alone")
    # A producer that knows every broker but asks the old leader first (its first seed): the old leader
    # must not keep it to itself once it can no longer know who leads.
    old = cluster.process_of(t.before.leader)
    seeds = [old.url, *(u for u in t.urls if u != old.url)]
    probe_at: list[float] = []
    t.tasks.append(asyncio.create_task(produce(seeds, t.topic, t.acked, t.stop, probe_at, prefix="p")))
    await cluster.until(lambda: probe_at, "the probe's first acknowledgement", 30)
    t.fault_at = time.monotonic()
    leader = t.host(t.before.leader)
    t.network.isolate_from_etcd(leader)
    for f in t.before.replicas:
        if f != t.before.leader:
            t.network.cut(leader, t.host(f))

    async def replaced() -> ReplicaRecord | None:
        rec = await replica_record(cluster, t.topic)
        moved = rec is not None and rec.leader != t.before.leader and rec.epoch > t.before.epoch
        return rec if moved else None

    await cluster.until(replaced, "an in-sync follower leads", FAILOVER_BOUND)
    served = await t.acks_grow(200, "the new leader acknowledges", FAILOVER_BOUND)
    print(f"\nnew leader acknowledging {served - t.fault_at:.2f} s after the fault")
    probed = len(probe_at)
    await cluster.until(
        lambda: len(probe_at) > probed + 4, "the old leader's first-seed producer served", FAILOVER_BOUND
    )
    print(f"the producer seeded with the old leader served again {time.monotonic() - t.fault_at:.2f} s")
    await hold(2.0)  # the old leader keeps running alone a little longer with traffic on the new one
    await heal_and_check(t, "leader alone with the clients")
