"""Replication factor per topic and per namespace on real processes (issue 16): three brokers on etcd whose
own default is one copy, the settings given through the `ister admin` CLI; and a standalone broker that
refuses more than one copy."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from ister.client import Client
from ister.core.replication import ReplicaRecord
from ister.metadata import keys
from ister.wire.gen import DanubeAdmin_pb2 as pb
from ister.wire.gen import DanubeAdmin_pb2_grpc as pb_grpc
from ister.wire.gen import ister_v1_pb2 as ipb
from ister.wire.gen import ister_v1_pb2_grpc as ipb_grpc
from tests.etcd_server import EtcdServer
from tests.integration.cluster import Cluster
from tests.integration.forkserver import run_ister
from tests.integration.harness import BrokerProcess

pytestmark = pytest.mark.timeout(240)

# Explicit: these tests rely on the brokers' own default being one copy, whatever the default becomes.
ONE_COPY_ENV = {"ISTER_CLUSTER__REPLICATION_FACTOR": "1", "ISTER_CLUSTER__REPLICA_MAX_LAG_SECONDS": "2"}


async def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(run_ister, list(args), timeout=60)


async def cli_ok(*args: str) -> str:
    done = await cli(*args)
    assert done.returncode == 0, f"{args}: {done.stderr}"
    return done.stdout


async def publish_one(url: str, topic: str) -> int:
    """An acknowledged record: the topic is loaded by its owner (its replica record written, if any)."""
    async with Client(url) as ister:
        pub = await ister.producer(topic)
        [offset] = await pub.send_batch([b"x"])
        await pub.flush()
    return offset


@pytest.fixture
async def cluster(tmp_path: Path, etcd_server: EtcdServer) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path, etcd_server.endpoint, 3, 2, env=ONE_COPY_ENV)
    try:
        await c.start()
        yield c
    finally:
        await c.stop()


async def test_topic_and_namespace_settings_decide_the_copies(cluster: Cluster) -> None:
    assert cluster.store is not None
    store = cluster.store
    admin = ["--admin-addr", cluster.brokers[0].admin_addr]

    async def record_of(topic: str) -> ReplicaRecord | None:
        kv = await store.get(keys.replicas(topic))
        return ReplicaRecord.parse(kv.value) if kv is not None else None

    async def wait_record(topic: str) -> ReplicaRecord:
        record: ReplicaRecord = await cluster.until(lambda: record_of(topic), f"a replica record of {topic}")
        return record

    # Per topic, at creation.
    await cli_ok(
        "admin", "topics", "create", "/default/rf3", "--reliable", "--replication-factor", "3", *admin
    )
    out = await cli_ok(
        "admin", "topics", "create", "/default/rf2", "--reliable",
        "--replication-factor", "2", "--min-insync", "1", *admin, "-o", "json",
    )  # fmt: skip
    assert json.loads(out) == {
        "success": True,
        "topic": "/default/rf2",
        "delivery": "Reliable",
        "replication_factor": 2,
        "min_insync_replicas": 1,
    }
    await cli_ok(
        "admin", "topics", "create", "/default/prf", "--reliable", "--partitions", "2",
        "--replication-factor", "3", *admin,
    )  # fmt: skip

    # Per namespace.
    await cli_ok("admin", "namespaces", "create", "triple", *admin)
    out = await cli_ok(
        "admin", "namespaces", "set-replication", "triple", "--replication-factor", "3", *admin
    )
    assert "replication_factor 3" in out
    policies = json.loads(await cli_ok("admin", "namespaces", "policies", "triple", *admin, "-o", "json"))
    assert policies["replication_factor"] == 3 and "min_insync_replicas" not in policies
    assert policies["max_message_size"] > 0  # the namespace's other policies are kept
    await cli_ok("admin", "topics", "create", "/triple/t", "--reliable", *admin)

    # Bad settings are refused with the reason, and nothing is created.
    for args, reason in (
        (("--replication-factor", "6"), "replication_factor must be in 1..5, got 6 (INVALID_ARGUMENT)"),
        (("--replication-factor", "2", "--min-insync", "3"), "min_insync_replicas must be in 1..2, got 3"),
        (("--min-insync", "2"), "min_insync_replicas must be in 1..1 (the replication factor that applies)"),
    ):
        done = await cli("admin", "topics", "create", "/default/refused", "--reliable", *args, *admin)
        assert done.returncode == 1 and reason in done.stderr, done.stderr
    assert await store.get(keys.namespace_topic("/default/refused")) is None
    assert await store.list(keys.topic_prefix("/default/refused")) == []
    done = await cli("admin", "namespaces", "set-replication", "triple", "--min-insync", "4", *admin)
    assert done.returncode == 1 and "min_insync_replicas must be in 1..3" in done.stderr, done.stderr

    # The topics load with those copies (a publish is acknowledged once the topic is served).
    url = cluster.brokers[0].url
    for topic in ("/default/rf3", "/default/rf2", "/triple/t", "/default/single"):
        await publish_one(url, topic)
    rf3 = await wait_record("/default/rf3")
    assert (len(rf3.replicas), rf3.min_insync, rf3.factor) == (3, 2, 3)
    rf2 = await wait_record("/default/rf2")
    assert (len(rf2.replicas), rf2.min_insync) == (2, 1)
    for part in ("/default/prf-part-0", "/default/prf-part-1"):
        rec = await wait_record(part)  # loaded on assignment, with no publish
        assert (len(rec.replicas), rec.min_insync) == (3, 2)
    triple = await wait_record("/triple/t")
    assert (len(triple.replicas), triple.min_insync) == (3, 2)
    # Nothing set anywhere: the brokers' one copy, no replica record.
    assert await record_of("/default/single") is None

    # What an operator sees.
    described = json.loads(await cli_ok("admin", "topics", "describe", "/default/rf3", *admin, "-o", "json"))
    assert len(described["replicas"]) == 3 and described["min_insync_replicas"] == 2

    # Deleting a topic deletes its setting.
    assert await store.get(keys.topic_replication("/default/rf2")) is not None
    await cli_ok("admin", "topics", "delete", "/default/rf2", *admin)
    assert await store.get(keys.topic_replication("/default/rf2")) is None
    assert await store.get(keys.topic_replication("/default/rf3")) is not None


async def test_a_standalone_broker_keeps_one_copy(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data")
    broker.start()
    try:
        admin = ["--admin-addr", broker.admin_addr]
        done = await cli(
            "admin", "topics", "create", "/default/t", "--reliable", "--replication-factor", "3", *admin
        )
        assert done.returncode == 1, done.stdout
        assert "a standalone broker keeps one copy of each topic (FAILED_PRECONDITION)" in done.stderr
        async with grpc.aio.insecure_channel(broker.admin_addr) as channel:
            topics = pb_grpc.TopicAdminStub(channel)
            request = pb.PartitionedTopicRequest(
                base_name="/default/p", partitions=2, dispatch_strategy=pb.Reliable, replication_factor=2
            )
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await topics.CreatePartitionedTopic(request, timeout=10)
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            listed = await topics.ListNamespaceTopics(pb.NamespaceRequest(name="default"), timeout=10)
            assert list(listed.topics) == []  # nothing was created
            namespaces = ipb_grpc.IsterAdminStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await namespaces.SetNamespaceReplication(
                    ipb.SetNamespaceReplicationRequest(namespace="default", replication_factor=3), timeout=10
                )
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        # One copy is what it keeps anyway: accepted.
        await cli_ok(
            "admin", "topics", "create", "/default/t", "--reliable", "--replication-factor", "1", *admin
        )
        assert await publish_one(broker.url, "/default/t") == 0
    finally:
        broker.stop()
