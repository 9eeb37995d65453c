"""Topics as Iceberg tables on a real cluster (issue 44 item 5, docs/tables.md): 3 brokers on etcd, the
topic on 3 replicas, the durable tier and the table files on SeaweedFS (S3), one shared SQL catalog. The
leader commits; after its kill -9 the next leader continues from the table's end offset under a higher
epoch, every row once, and a commit at the deposed leader's epoch is refused."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from ister.client import Client
from ister.core.replication import ReplicaRecord
from ister.errors import Fenced
from ister.metadata import keys
from ister.tables.committer import EPOCH, TableWriter
from ister.tables.shapes import BYTES_SHAPE
from ister.tables.typed import to_arrow
from tests.etcd_server import EtcdServer
from tests.integration.cluster import Cluster
from tests.integration.table_cluster import table_cluster
from tests.seaweed_server import SeaweedServer

pytestmark = pytest.mark.timeout(300)

TOPIC = "/default/lake"
ISTER = [sys.executable, "-m", "ister.cli"]


@pytest.fixture
async def cluster(tmp_path: Path, etcd_server: EtcdServer, seaweed: SeaweedServer) -> AsyncIterator[Cluster]:
    async with table_cluster(
        tmp_path, etcd_server.endpoint, seaweed, f"sqlite:///{tmp_path / 'shared-catalog.db'}"
    ) as c:
        yield c


def cli(*args: str) -> str:
    done = subprocess.run([*ISTER, *args], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def catalog(cluster: Cluster) -> Any:
    from pyiceberg.catalog import load_catalog

    running = next(b for b in cluster.brokers if b.running)  # the killed leader's admin API is gone
    found = json.loads(cli("table", TOPIC, "--admin-addr", running.admin_addr, "-o", "json"))
    assert found["table"] == "default.lake" and found["properties"]["warehouse"].startswith("s3://")
    assert "s3.secret-access-key" not in found["properties"]  # no secrets printed
    props = {**found["properties"], "s3.secret-access-key": cluster.secret}  # type: ignore[attr-defined]
    return load_catalog(found["catalog_name"], uri=found["catalog_uri"], **props)


def rows(cluster: Cluster) -> pa.Table:
    return catalog(cluster).load_table("default.lake").scan().to_arrow().sort_by("offset")


async def publish(url: str, count: int, tag: str) -> None:
    async with Client(url) as ister:
        producer = await ister.producer(TOPIC, max_batch_messages=500)
        for i in range(0, count, 500):
            await producer.send_batch([f"{tag}-{i + j}".encode() for j in range(500)])


def history(cluster: Cluster) -> list[dict[str, str]]:
    """The table's snapshot summaries (what a failed wait shows)."""
    try:
        return [
            dict(s.summary.additional_properties)
            for s in catalog(cluster).load_table("default.lake").snapshots()
        ]
    except Exception as exc:
        return [{"error": str(exc)}]


async def leader(cluster: Cluster) -> int:
    assert cluster.store is not None
    kv = await cluster.store.get(keys.replicas(TOPIC))
    record = ReplicaRecord.parse(kv.value) if kv is not None else None
    assert record is not None
    return record.leader


async def test_leader_commits_failover_continues_deposed_epoch_refused(cluster: Cluster) -> None:
    entry = cluster.brokers[0]
    await publish(entry.url, 3_000, "a")
    cli(
        "admin",
        "namespaces",
        "set-table",
        "default",
        "--format",
        "iceberg",
        "--interval",
        "1s",
        "--admin-addr",
        entry.admin_addr,
    )

    def count() -> int:
        try:
            snap = catalog(cluster).load_table("default.lake").current_snapshot()
        except Exception:  # not created yet
            return -1
        return int(snap.summary["total-records"]) if snap is not None else 0

    await cluster.until(lambda: count() == 3_000, "the leader committed the topic", 90)
    table = catalog(cluster).load_table("default.lake")
    first_epoch = int(table.current_snapshot().summary.additional_properties[EPOCH])

    victim = cluster.process_of(await leader(cluster))
    victim.kill9()
    survivor = next(b for b in cluster.brokers if b is not victim)

    async def published() -> bool:
        try:
            await publish(survivor.url, 2_000, "b")
        except Exception:  # no leader yet
            return False
        return True

    await cluster.until(published, "the next leader takes publishes", 90)
    async with Client(survivor.url) as ister:
        span = await ister.offsets(TOPIC)  # 5,000 or more: a publish cut by the failover was retried
        assert span.next >= 5_000
        await cluster.until(
            lambda: count() == span.next, lambda: f"all {span.next} rows: {history(cluster)}", 90
        )
        records = [r async for b in ister.read(TOPIC, 0, span.next) for r in b]
    assert rows(cluster).equals(to_arrow(BYTES_SHAPE, records))
    table = catalog(cluster).load_table("default.lake")
    new_epoch = int(table.current_snapshot().summary.additional_properties[EPOCH])
    assert new_epoch > first_epoch

    # the deposed leader's commit (its epoch) is refused; the table is unchanged
    zombie = TableWriter(catalog(cluster), ("default", "lake"), BYTES_SHAPE, "day")
    late = to_arrow(BYTES_SHAPE, records[-10:])
    with pytest.raises(Fenced):
        zombie.append(late, len(records), len(records) + 10, first_epoch)
    assert len(rows(cluster)) == span.next
