"""Topic and subscription stats on a 3-broker cluster with RF 3 (issue 38 item 1): every broker answers with
the owner's live numbers (forwarded over the admin port), the listing gathers every broker's part, and what
the user sees when the owner does not answer (kill -9) or etcd is down."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from ister.client import Client
from ister.wire.gen import ister_v1_pb2 as pb
from tests.etcd_server import EtcdServer
from tests.integration.cluster import Cluster
from tests.integration.test_topic_stats import listing, stats, sub_of
from tests.support import until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ISTER = [sys.executable, "-m", "ister.cli"]
RF_ENV = {"ISTER_CLUSTER__REPLICATION_FACTOR": "3", "ISTER_CLUSTER__MIN_INSYNC_REPLICAS": "2"}
LEASE_TTL = 20  # a killed owner stays registered (and the owner of its topics) while the test asks


def cli(addr: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ISTER, "admin", *args, "--admin-addr", addr],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_any_broker_answers_with_the_owners_numbers(tmp_path: Path) -> None:
    etcd = EtcdServer(tmp_path / "etcd")
    etcd.start()
    cluster = Cluster(tmp_path, etcd.endpoint, 3, LEASE_TTL, env=RF_ENV)
    topic = "/default/cstats"
    try:
        await cluster.start()
        async with Client(cluster.brokers[0].url) as client:
            producer = await client.producer(topic, "cp")
            consumer = await client.consumer(topic, "csub", type="shared", name="cc", window=5)
            await producer.send_batch([b"c" * 64 for _ in range(12)])
            got = []
            async for m in consumer:
                got.append(m)
                if len(got) == 2:
                    break
            for m in got:
                await m.ack()
            owner = (await cluster.assignments())[topic]
            ids = {cluster.broker_id(b) for b in cluster.brokers}

            async def agreed() -> list[pb.TopicStats] | None:
                answers = [(await stats(b.admin_addr, topic)).total for b in cluster.brokers]
                for t in answers:
                    w = sub_of(t, "csub")
                    rep = t.replication
                    if not (w.HasField("cursor") and w.cursor == 1 and w.unacked_in_flight == 5):
                        return None
                    if sorted(rep.follower_lag.values()) != [0, 0] or len(rep.in_sync) != 3:
                        return None
                return answers

            answers = await until(agreed, "every broker showing the owner's live numbers", within=60)
            for t in answers:
                assert t.owner_broker_id == str(owner)
                assert (t.end_offset, t.message_count, t.messages_in_total, t.bytes_in_total) == (
                    12,
                    12,
                    12,
                    768,
                )
                rep = t.replication
                assert {int(b) for b in rep.replicas} == ids and rep.min_insync == 2
                assert set(rep.follower_lag) == {str(b) for b in ids - {owner}}
                [p] = t.producers
                assert (p.name, p.messages_total) == ("cp", 12)
                w = sub_of(t, "csub")
                assert (w.next_offset, w.backlog_messages, w.owner_broker_id) == (2, 10, str(owner))
                [c] = w.consumers
                assert c.name == "cc" and c.connected and c.unacked == 5
                assert t.storage.wal_bytes > 12 * 64
            # the listing from a broker that does not own the topic
            other = next(b for b in cluster.brokers if cluster.broker_id(b) != owner)
            done = await asyncio.to_thread(cli, other.admin_addr, "subscriptions", "list", "-o", "json")
            assert done.returncode == 0, done.stderr
            doc = json.loads(done.stdout)
            assert doc["failed_brokers"] == []
            [e] = [e for e in doc["subscriptions"] if e["topic"] == topic]
            assert (e["subscription"], e["backlog_messages"], e["owner_broker_id"]) == (
                "csub",
                10,
                str(owner),
            )
            assert e["live"] is True
            await consumer.close()

        # The owner dies (kill -9): before its lease ends it still owns the topic and is registered.
        victim = cluster.process_of(owner)
        victim.kill9()
        asker = next(b for b in cluster.brokers if b is not victim)
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await stats(asker.admin_addr, topic)
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        assert f"broker {owner}" in (failed.value.details() or "")
        gathered = await listing(asker.admin_addr)
        assert [f.broker_id for f in gathered.failed_brokers] == [str(owner)]
        done = await asyncio.to_thread(cli, asker.admin_addr, "subscriptions", "list")
        assert done.returncode == 1 and f"warning: broker {owner} did not answer" in done.stderr
        assert "Traceback" not in done.stderr
        assert done.stdout.strip() == "(none)"  # the one subscription lives on the dead owner

        # etcd is down: the answer says so, and the broker keeps running.
        etcd.stop()
        for args in (("topics", "stats", topic), ("subscriptions", "list")):
            done = await asyncio.to_thread(cli, asker.admin_addr, *args)
            assert done.returncode == 1, (args, done.stdout)
            assert done.stderr.startswith("error:") and "Traceback" not in done.stderr
        assert asker.proc is not None and asker.proc.poll() is None
    finally:
        await cluster.stop()
        etcd.stop()
