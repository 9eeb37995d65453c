"""The series of docs/metrics.md on a real broker, scraped after publishing, consuming and acknowledging.

Each histogram's count is checked against what the test did (one observation per publish batch, per ack
request, per fsync), its values for plausibility (no latency over the test's own duration).
"""

from __future__ import annotations

import asyncio
import platform
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import danube
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ister.client import Client
from ister.core.replication import ReplicaRecord
from ister.metadata import keys
from tests.etcd_server import EtcdServer
from tests.integration.cluster import Cluster
from tests.integration.harness import BrokerProcess, client
from tests.support import until

pytestmark = pytest.mark.integration

FAST_EXPORT = {
    "ISTER_STORAGE__DURABLE__EXPORT_INTERVAL_SECONDS": "0.2",
    "ISTER_STORAGE__DURABLE__SEGMENT_MAX_AGE_SECONDS": "0.5",
}
HISTOGRAMS = (
    "ister_publish_durable_seconds",
    "ister_publish_committed_seconds",
    "ister_wal_fsync_seconds",
    "ister_dispatch_delay_seconds",
    "ister_ack_latency_seconds",
    "ister_replication_round_trip_seconds",
)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def buckets(samples: Samples, name: str) -> list[tuple[float, float]]:
    return sorted((float(dict(k[1])["le"]), v) for k, v in samples.items() if k[0] == f"{name}_bucket")


async def replica_record(cluster: Cluster, topic: str) -> ReplicaRecord | None:
    assert cluster.store is not None
    kv = await cluster.store.get(keys.replicas(topic))
    return ReplicaRecord.parse(kv.value) if kv is not None else None


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path / "data", env=FAST_EXPORT)
    b.start()
    yield b
    b.stop()


async def test_new_series_after_publish_consume_and_ack(broker: BrokerProcess) -> None:
    started = time.monotonic()
    url = broker.metrics_url
    before = await asyncio.to_thread(scrape, url)
    for name in HISTOGRAMS:  # exported from the start, empty
        assert value(before, f"{name}_count") == 0, name
        assert buckets(before, name)[-1] == (float("inf"), 0), name
    assert not [k for k in before if k[0].endswith("_created")], "no _created series"
    info = [dict(k[1]) for k in before if k[0] == "ister_build_info"]
    assert len(info) == 1 and info[0]["python"] == platform.python_version()
    assert info[0]["version"] and info[0]["commit"]

    topic = "/default/metrics_series"
    async with Client(broker.url) as ister:
        producer = await ister.producer(topic)
        c = await client(broker.url)
        consumer = (
            c.new_consumer()
            .with_topic(topic)
            .with_consumer_name("c1")
            .with_subscription("s1")
            .with_subscription_type(danube.SubType.EXCLUSIVE)
            .build()
        )
        await consumer.subscribe()
        queue = await consumer.receive()
        for _ in range(3):
            await producer.send_batch([b"x" * 100] * 10)  # one batch each: returns once durable

    # A scrape may get the body rendered for the one before (shared for 9 times its rendering time).
    def published() -> Samples | None:
        samples = scrape(url)
        return samples if value(samples, "ister_publish_durable_seconds_count") == 3 else None

    after_publish = await until(lambda: asyncio.to_thread(published), "3 publish batches observed")
    assert value(after_publish, "ister_publish_committed_seconds_count") == 3
    # Three batches awaited one after the other: each needed an fsync of its own.
    assert (value(after_publish, "ister_wal_fsync_seconds_count") or 0) >= 3
    assert value(after_publish, "ister_replication_round_trip_seconds_count") == 0  # standalone

    for _ in range(30):
        message = await asyncio.wait_for(queue.get(), 10)
        await consumer.ack(message)  # the official client acknowledges one message per request

    def acked_all() -> Samples | None:
        samples = scrape(url)
        return samples if value(samples, "ister_ack_latency_seconds_count") == 30 else None

    samples = await until(lambda: asyncio.to_thread(acked_all), "30 acks observed")
    elapsed = time.monotonic() - started
    deliveries = value(samples, "ister_dispatch_delay_seconds_count") or 0
    assert 1 <= deliveries <= 30
    for name in HISTOGRAMS[:-1]:
        count = value(samples, f"{name}_count") or 0
        total = value(samples, f"{name}_sum") or 0
        assert count >= 1, name
        assert 0 <= total / count <= elapsed, f"{name}: mean {total / count} s"
        cumulative = [n for _, n in buckets(samples, name)]
        assert cumulative == sorted(cumulative) and cumulative[-1] == count, name
    assert value(samples, "danube_consumer_messages_out_total", topic=topic, subscription="s1") == 30
    assert value(samples, "ister_topic_start_offset", topic=topic) == 0

    # The export walk (every 0.2 s here) publishes the storage series; the active segment rotates after
    # 0.5 s idle and is exported, which empties the export backlog.
    def exported() -> Samples | None:
        s = scrape(url)
        done = (value(s, "ister_topic_object_bytes", topic=topic) or 0) > 0 and value(
            s, "ister_topic_export_backlog_bytes", topic=topic
        ) == 0
        return s if done else None

    samples = await until(lambda: asyncio.to_thread(exported), "the topic exported", within=20)
    assert value(samples, "ister_topic_end_offset", topic=topic) == 30
    assert (value(samples, "ister_topic_wal_bytes", topic=topic) or 0) >= 30 * 100
    assert value(samples, "ister_topic_export_backlog_age_seconds", topic=topic) == 0
    assert (value(samples, "ister_broker_object_bytes") or 0) >= 30 * 100
    assert value(samples, "ister_export_backlog_oldest_seconds") is not None
    assert (value(samples, "ister_object_store_requests_total", operation="put") or 0) >= 1
    assert value(samples, "ister_object_store_errors_total", operation="put", error="unavailable") == 0
    await consumer.close()


RF_ENV = {
    "ISTER_CLUSTER__REPLICATION_FACTOR": "3",
    "ISTER_CLUSTER__MIN_INSYNC_REPLICAS": "2",
    "ISTER_CLUSTER__REPLICA_MAX_LAG_SECONDS": "2",
}


@pytest.mark.timeout(300)
async def test_replication_series_on_a_three_broker_cluster(tmp_path: Path, etcd_server: EtcdServer) -> None:
    cluster = Cluster(tmp_path, etcd_server.endpoint, 3, 2, env=RF_ENV)
    try:
        await cluster.start()
        topic = "/default/metrics_replicated"
        async with Client(cluster.brokers[0].url) as ister:
            producer = await ister.producer(topic)
            for _ in range(3):
                await producer.send_batch([b"r" * 100] * 10)  # acknowledged once 2 of 3 hold it
        record = await cluster.until(lambda: replica_record(cluster, topic), "a replica record")
        leader = cluster.process_of(record.leader)

        def replicated() -> Samples | None:
            s = scrape(leader.metrics_url)
            done = (value(s, "ister_replication_round_trip_seconds_count") or 0) >= 2
            return s if done and value(s, "ister_publish_committed_seconds_count") == 3 else None

        samples = await until(lambda: asyncio.to_thread(replicated), "round trips on the leader", within=20)
        count = value(samples, "ister_replication_round_trip_seconds_count") or 0
        mean = (value(samples, "ister_replication_round_trip_seconds_sum") or 0) / count
        assert 0 <= mean < 10
        # Committed waits for a follower too: never less than the local durability of the same batches.
        assert (value(samples, "ister_publish_committed_seconds_sum") or 0) >= (
            value(samples, "ister_publish_durable_seconds_sum") or 0
        )
        assert value(samples, "ister_isr_shrinks_total") == 0
        assert value(samples, "ister_under_replicated_topics") == 0

        # A follower dies: it leaves the in-sync set (after replica_max_lag_seconds), which is counted.
        follower = next(r for r in record.replicas if r != record.leader)
        cluster.process_of(follower).kill9()

        def shrunk() -> Samples | None:
            s = scrape(leader.metrics_url)
            done = (value(s, "ister_isr_shrinks_total") or 0) >= 1
            return s if done and value(s, "ister_under_replicated_topics") == 1 else None

        await until(lambda: asyncio.to_thread(shrunk), "the in-sync set shrunk", within=30)
    finally:
        await cluster.stop()
