"""Idempotent producers through kill -9 (issue 43): the Ister client's producers keep sending while the broker
(standalone, RF 1) or the topic's leader (a 3-broker cluster, RF 3) is killed round after round; the client
re-sends every unacknowledged batch, and afterwards every message is stored exactly once, at one offset,
and every acknowledged one is read back at the offset its producer was told.

A kill lands between a batch's fsync and its ack often enough that the retried batches are answered from
the dedup table rebuilt from the log (the broker's `ister_publish_duplicates_total` says how often).
Rounds: ISTER_IDEM_ROUNDS (default 5); `ister chaos`-style longer runs: ISTER_IDEM_ROUNDS=20.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ister import errors
from ister.client import Client
from tests.etcd_server import EtcdServer
from tests.integration.cluster import Cluster
from tests.integration.harness import BrokerProcess, broker_metric
from tests.integration.replication_support import RF_ENV, read_all, replica_record
from tests.support import until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROUNDS = int(os.environ.get("ISTER_IDEM_ROUNDS", "5"))
SENDERS = 4
PER_ROUND = 300  # acknowledged messages between two kills


class Traffic:
    """SENDERS tasks each sending batches of 20 distinct payloads on one idempotent producer."""

    def __init__(self) -> None:
        self.acked: dict[int, bytes] = {}
        self.sent: set[bytes] = set()
        self.failed = 0
        self.stop = asyncio.Event()

    async def run(self, client: Client, topic: str) -> None:
        producer = await client.producer(topic, "chaos", linger_ms=1, max_batch_messages=20)
        await asyncio.gather(*(self._sender(producer, i) for i in range(SENDERS)))

    async def _sender(self, producer: object, index: int) -> None:
        n = 0
        while not self.stop.is_set():
            payloads = [b"s%d-%d" % (index, n + i) for i in range(20)]
            n += 20
            self.sent.update(payloads)
            try:
                offsets = await producer.send_batch(payloads)  # type: ignore[attr-defined]
            except errors.IsterError:
                self.failed += 1  # not acknowledged: stored at most once, never counted as acked
                continue
            for offset, payload in zip(offsets, payloads, strict=True):
                assert self.acked.setdefault(offset, payload) == payload, f"offset {offset} acked twice"

    def check(self, stored: dict[int, bytes]) -> int:
        """Every acknowledged message at its offset, nothing stored twice; returns the messages stored."""
        lost = [o for o, p in self.acked.items() if stored.get(o) != p]
        assert not lost, f"{len(lost)} acknowledged offsets lost or changed, first {sorted(lost)[:5]}"
        twice = [p for p, n in Counter(stored.values()).items() if n > 1]
        assert not twice, f"{len(twice)} messages stored twice, e.g. {twice[:3]}"
        assert set(stored.values()) <= self.sent
        return len(stored)


async def test_standalone_kill9_rounds_store_each_message_once(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data")
    broker.start()
    topic = "/default/idempotent_kill9"
    traffic = Traffic()
    answered = 0.0
    try:
        async with Client(broker.url, retry_timeout=60.0) as client:
            task = asyncio.create_task(traffic.run(client, topic))
            try:
                for _ in range(ROUNDS):
                    before = len(traffic.acked)
                    await until(
                        lambda b=before: len(traffic.acked) >= b + PER_ROUND or task.done(), "acks", 60
                    )
                    assert not task.done(), task
                    answered += broker_metric(broker.metrics_url, "ister_publish_duplicates_total") or 0
                    broker.kill9()
                    broker.start()
                before = len(traffic.acked)
                await until(lambda: len(traffic.acked) >= before + PER_ROUND, "acks after the last round", 60)
            finally:
                traffic.stop.set()
                await task
            answered += broker_metric(broker.metrics_url, "ister_publish_duplicates_total") or 0
            head = (await client.offsets(topic)).next
        stored = await read_all(broker.url, topic, head)
    finally:
        broker.stop()
    n = traffic.check(stored)
    assert n == head, "offsets are dense"
    print(
        f"{ROUNDS} kill -9 rounds: {len(traffic.acked)} acknowledged, {n} stored once each, "
        f"{answered:g} retried messages answered with their original offsets, {traffic.failed} sends failed"
    )


@pytest.fixture
async def cluster(tmp_path: Path, etcd_server: EtcdServer) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path, etcd_server.endpoint, 3, 2, env=RF_ENV)
    try:
        await c.start()
        yield c
    finally:
        await c.stop()


async def test_rf3_leader_kill9_rounds_store_each_message_once(cluster: Cluster) -> None:
    """A follower is promoted each round: it rebuilt the table from the frames it holds."""
    topic = "/default/idempotent_rf3"
    urls = [b.url for b in cluster.brokers]
    traffic = Traffic()
    async with Client(urls, retry_timeout=60.0) as client:
        task = asyncio.create_task(traffic.run(client, topic))
        try:
            await until(lambda: len(traffic.acked) >= PER_ROUND, "traffic flows", 60)
            for round_ in range(ROUNDS):
                record = await cluster.until(lambda: replica_record(cluster, topic), "a replica record")
                victim = cluster.process_of(record.leader)
                before = len(traffic.acked)
                victim.kill9()
                await until(
                    lambda b=before: len(traffic.acked) >= b + PER_ROUND, f"round {round_}: resumes", 60
                )
                victim.start()

                async def all_in_sync() -> bool:
                    rec = await replica_record(cluster, topic)
                    return rec is not None and len(rec.isr) == 3

                await cluster.until(all_in_sync, f"round {round_}: the restarted broker is in sync", 60)
        finally:
            traffic.stop.set()
            await task
        head = (await client.offsets(topic)).next
    stored = await read_all(urls, topic, head)
    n = traffic.check(stored)
    print(f"{ROUNDS} leader kills (RF 3): {len(traffic.acked)} acknowledged, {n} stored once each")
