"""Topics as Iceberg tables in a PostgreSQL catalog (issue 44 item 1, docs/tables.md "Catalogs"): a real
PostgreSQL server (tests/postgres_server.py) as `tables.catalog_uri`. A standalone broker commits and the
snippet `ister table` prints reads the rows back as printed (the password from PGPASSWORD, never printed);
three brokers on etcd share the catalog and a kill -9 of the topic's leader leaves every row exactly once;
PostgreSQL stopped while committing: commits fail and are counted, nothing is lost, and after its restart
the table holds exactly the topic."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from ister.client import Client
from ister.core.replication import ReplicaRecord
from ister.metadata import keys
from ister.tables.shapes import BYTES_SHAPE
from ister.tables.typed import to_arrow
from tests.etcd_server import EtcdServer
from tests.integration.cluster import Cluster
from tests.integration.harness import BrokerProcess, broker_metric
from tests.integration.table_cluster import table_cluster
from tests.postgres_server import PASSWORD, USER, PostgresServer, postgres_bin
from tests.seaweed_server import SeaweedServer
from tests.support import until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ISTER = [sys.executable, "-m", "ister.cli"]
FAST = {
    "ISTER_STORAGE__DURABLE__EXPORT_INTERVAL_SECONDS": "0.2",
    "ISTER_STORAGE__DURABLE__SEGMENT_MAX_AGE_SECONDS": "0.5",
    "ISTER_WAL__SEGMENT_MAX_BYTES": "262144",
}


@pytest.fixture(autouse=True)
def pgpassword(monkeypatch: pytest.MonkeyPatch) -> None:
    """Readers (this process, the snippets it runs) log in as a reader would: `ister table` prints no
    password, libpq takes it from PGPASSWORD."""
    monkeypatch.setenv("PGPASSWORD", PASSWORD)


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL of the test's own, for the test that stops it."""
    if postgres_bin() is None:
        pytest.skip("PostgreSQL is not installed: run `make test` (installs postgresql)")
    server = PostgresServer()
    server.start()
    yield server
    server.remove()


def cli(*args: str) -> str:
    done = subprocess.run([*ISTER, *args], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def found(admin_addr: str, topic: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(cli("table", topic, "--admin-addr", admin_addr, "-o", "json"))
    return out


def load_table(admin_addr: str, topic: str, **secrets: str) -> Any:
    from pyiceberg.catalog import load_catalog

    f = found(admin_addr, topic)
    return load_catalog(f["catalog_name"], uri=f["catalog_uri"], **f["properties"], **secrets).load_table(
        f["table"]
    )


def count_rows(admin_addr: str, topic: str, **secrets: str) -> int:
    """The rows of the table's current snapshot; -1 before the table exists or while the catalog is down."""
    try:
        snap = load_table(admin_addr, topic, **secrets).current_snapshot()
    except Exception:
        return -1
    return int(snap.summary["total-records"]) if snap is not None else 0


async def publish(url: str, topic: str, count: int, tag: str) -> None:
    async with Client(url) as ister:
        producer = await ister.producer(topic, max_batch_messages=500)
        for i in range(0, count, 500):
            await producer.send_batch([f"{tag}-{i + j}".encode() for j in range(min(500, count - i))])


async def topic_rows(url: str, topic: str) -> pa.Table:
    async with Client(url) as ister:
        span = await ister.offsets(topic)
        records = [r async for batch in ister.read(topic, 0, span.next) for r in batch]
    return to_arrow(BYTES_SHAPE, records)


def run_python(code: str, env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False, env=dict(env)
    )


def turn_on(admin_addr: str, ns: str) -> None:
    cli("admin", "namespaces", "create", ns, "--admin-addr", admin_addr)
    cli(
        "admin",
        "namespaces",
        "set-table",
        ns,
        "--format",
        "iceberg",
        "--interval",
        "1s",
        "--admin-addr",
        admin_addr,
    )


def standalone(tmp_path: Path, uri: str) -> BrokerProcess:
    broker = BrokerProcess(tmp_path / "data", env={**FAST, "ISTER_TABLES__CATALOG_URI": uri})
    broker.start()
    return broker


async def test_standalone_broker_commits_to_postgresql_and_the_printed_snippet_reads_it(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    ns = f"pg{uuid.uuid4().hex[:8]}"
    topic = f"/{ns}/events"
    broker = standalone(tmp_path, postgres.url)
    try:
        turn_on(broker.admin_addr, ns)
        await publish(broker.url, topic, 1_500, "a")
        await until(lambda: count_rows(broker.admin_addr, topic) == 1_500, "the topic committed", 60)
        printed = cli("table", topic, "--admin-addr", broker.admin_addr)
        uri = f"postgresql+psycopg2://{USER}@127.0.0.1:{postgres.port}/ister"
        assert uri in printed, printed
        assert PASSWORD not in printed  # the broker's URI has it; what it prints does not
        code = printed.split("# pyiceberg\n", 1)[1].split("\n# ", 1)[0]
        check = "\nprint(df.num_rows, sorted(df.column('offset').to_pylist()) == list(range(1_500)))"
        ran = run_python(code + check, os.environ)
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout.strip() == "1500 True"
        refused = run_python(code, {k: v for k, v in os.environ.items() if k != "PGPASSWORD"})
        assert refused.returncode != 0 and "password" in refused.stderr  # the login needs the password
        table = load_table(broker.admin_addr, topic).scan().to_arrow().sort_by("offset")
        assert table.equals(await topic_rows(broker.url, topic))
    finally:
        broker.stop()


async def test_postgresql_stopped_while_committing_commits_wait_then_every_row_once(
    tmp_path: Path, own_postgres: PostgresServer
) -> None:
    ns = f"pg{uuid.uuid4().hex[:8]}"
    topic = f"/{ns}/outage"
    # no password in the URI: the broker's libpq takes it from PGPASSWORD (inherited, set above)
    broker = standalone(tmp_path, f"postgresql://{USER}@127.0.0.1:{own_postgres.port}/ister")

    def failed() -> float:
        return (
            broker_metric(broker.metrics_url, "ister_table_commits_total", op="append", result="failed")
            or 0.0
        )

    try:
        turn_on(broker.admin_addr, ns)
        await publish(broker.url, topic, 2_000, "before")
        await until(lambda: count_rows(broker.admin_addr, topic) == 2_000, "committed before the outage", 60)
        table = load_table(broker.admin_addr, topic)  # loaded while the catalog answers
        own_postgres.stop()
        await publish(broker.url, topic, 3_000, "during")  # publishing does not wait for the catalog
        await until(lambda: failed() >= 2, "commits failed and counted while PostgreSQL is down", 60)
        own_postgres.start()
        await until(lambda: count_rows(broker.admin_addr, topic) == 5_000, "everything committed after", 60)
        expected = await topic_rows(broker.url, topic)
        table.refresh()
        assert table.scan().to_arrow().sort_by("offset").equals(expected)
        assert len(expected) == 5_000
    finally:
        broker.stop()


@pytest.fixture
async def cluster(
    tmp_path: Path, etcd_server: EtcdServer, seaweed: SeaweedServer, postgres: PostgresServer
) -> AsyncIterator[Cluster]:
    async with table_cluster(tmp_path, etcd_server.endpoint, seaweed, postgres.url) as c:
        yield c


async def test_three_brokers_share_the_postgresql_catalog_leader_killed_every_row_once(
    cluster: Cluster,
) -> None:
    ns = f"pg{uuid.uuid4().hex[:8]}"
    topic = f"/{ns}/lake"
    entry = cluster.brokers[0]
    secret = {"s3.secret-access-key": cluster.secret}  # type: ignore[attr-defined]
    turn_on(entry.admin_addr, ns)
    await publish(entry.url, topic, 3_000, "a")

    def count() -> int:
        running = next(b for b in cluster.brokers if b.running)  # the killed leader's admin API is gone
        return count_rows(running.admin_addr, topic, **secret)

    await cluster.until(lambda: count() == 3_000, "the leader committed to PostgreSQL", 90)
    assert cluster.store is not None
    kv = await cluster.store.get(keys.replicas(topic))
    record = ReplicaRecord.parse(kv.value) if kv is not None else None
    assert record is not None
    victim = cluster.process_of(record.leader)
    victim.kill9()
    survivor = next(b for b in cluster.brokers if b is not victim)

    async def published() -> bool:
        try:
            await publish(survivor.url, topic, 2_000, "b")
        except Exception:  # no leader yet
            return False
        return True

    await cluster.until(published, "the next leader takes publishes", 90)
    expected = await topic_rows(survivor.url, topic)
    assert len(expected) >= 5_000  # more: a publish cut by the failover was retried
    await cluster.until(lambda: count() == len(expected), f"all {len(expected)} rows committed", 90)
    table = load_table(survivor.admin_addr, topic, **secret)
    assert table.scan().to_arrow().sort_by("offset").equals(expected)  # nothing lost, nothing twice
