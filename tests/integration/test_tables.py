"""Topics as Iceberg tables with real broker processes (issue 44, docs/tables.md): the policy from the CLI,
the table read back with pyiceberg and DuckDB equal to the topic row for row, freshness within the
interval, kill -9 at each commit step, retention removing rows and files, a catalog outage."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest

from ister.client import Client
from ister.tables.shapes import BYTES_SHAPE
from ister.tables.typed import to_arrow
from tests.integration.harness import BrokerProcess
from tests.support import until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ISTER = [sys.executable, "-m", "ister.cli"]
FAST = {
    "ISTER_STORAGE__DURABLE__EXPORT_INTERVAL_SECONDS": "0.2",
    "ISTER_STORAGE__DURABLE__SEGMENT_MAX_AGE_SECONDS": "0.5",
    "ISTER_WAL__SEGMENT_MAX_BYTES": "262144",
}
NS = "lake"


def cli(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([*ISTER, *args], capture_output=True, text=True, timeout=60, check=False)
    if ok:
        assert done.returncode == 0, done.stderr
    return done


def run_snippet(code: str) -> str:
    ran = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert ran.returncode == 0, ran.stderr
    return ran.stdout.strip()


def load_table(broker: BrokerProcess, topic: str) -> Any:
    from pyiceberg.catalog import load_catalog

    found = json.loads(cli("table", topic, "--admin-addr", broker.admin_addr, "-o", "json").stdout)
    catalog = load_catalog(found["catalog_name"], uri=found["catalog_uri"], **found["properties"])
    return catalog.load_table(found["table"])


_LOADED: dict[tuple[str, str], Any] = {}


def handle(broker: BrokerProcess, topic: str) -> Any:
    """The topic's table, looked up through `ister table` once per broker and topic, then refreshed."""
    key = (broker.admin_addr, topic)
    if key not in _LOADED:
        _LOADED[key] = load_table(broker, topic)
    table = _LOADED[key]
    table.refresh()
    return table


def offline_rows(broker: BrokerProcess, topic: str) -> int:
    """The table's rows read from the broker's own SQLite catalog while the broker is down."""
    from pyiceberg.catalog import load_catalog

    catalog = load_catalog("ister", uri=f"sqlite:///{broker.data_dir.resolve()}/tables/catalog.db")
    snap = catalog.load_table((NS, topic.rsplit("/", 1)[1])).current_snapshot()
    return int(snap.summary["total-records"]) if snap is not None else 0


def table_rows(broker: BrokerProcess, topic: str) -> pa.Table:
    return handle(broker, topic).scan().to_arrow().sort_by("offset")


def count_rows(broker: BrokerProcess, topic: str) -> int:
    """The rows of the table's current snapshot (its summary's total)."""
    try:
        table = handle(broker, topic)
    except Exception:  # no table yet (NoSuchTableError)
        return -1
    snap = table.current_snapshot()
    return int(snap.summary["total-records"]) if snap is not None else 0


async def topic_rows(client: Client, topic: str) -> pa.Table:
    span = await client.offsets(topic)
    records = [r async for batch in client.read(topic, 0, span.next) for r in batch]
    return to_arrow(BYTES_SHAPE, records)


async def publish(client: Client, topic: str, count: int, tag: str = "m") -> None:
    producer = await client.producer(topic, max_batch_messages=500)
    for i in range(0, count, 500):
        await producer.send_batch([f"{tag}-{i + j}".encode() for j in range(min(500, count - i))])


def start(tmp_path: Path, **env: str) -> BrokerProcess:
    broker = BrokerProcess(tmp_path / "data", env={**FAST, **env})
    broker.start()
    cli("admin", "namespaces", "create", NS, "--admin-addr", broker.admin_addr)
    return broker


async def test_policy_rows_duckdb_freshness_and_compaction(tmp_path: Path) -> None:
    # segments roll after 6 s idle: the trickle below lands in one segment, in several tail commits
    broker = start(tmp_path, ISTER_STORAGE__DURABLE__SEGMENT_MAX_AGE_SECONDS="6")
    topic = f"/{NS}/events"
    try:
        bad = cli(
            "admin",
            "namespaces",
            "set-table",
            NS,
            "--format",
            "parquet",
            "--admin-addr",
            broker.admin_addr,
            ok=False,
        )
        assert bad.returncode == 1 and "unknown table format" in bad.stderr
        bad = cli(
            "admin",
            "namespaces",
            "set-table",
            NS,
            "--interval",
            "10ms",
            "--admin-addr",
            broker.admin_addr,
            ok=False,
        )
        assert bad.returncode == 1 and "out of range" in bad.stderr
        shown = cli("admin", "namespaces", "table", NS, "--admin-addr", broker.admin_addr).stdout
        assert "table format:    none (default)" in shown, shown
        async with Client(broker.url) as client:
            await publish(client, topic, 10_000)
            out = cli(
                "admin",
                "namespaces",
                "set-table",
                NS,
                "--format",
                "iceberg",
                "--interval",
                "1s",
                "--admin-addr",
                broker.admin_addr,
            ).stdout
            assert "iceberg (namespace)" in out and "1s (namespace)" in out, out
            await until(lambda: count_rows(broker, topic) == 10_000, "the backlog committed", 60)
            await publish(client, topic, 10_000, "n")
            sent = time.monotonic()
            await until(lambda: count_rows(broker, topic) == 20_000, "the tail committed", 30)
            fresh = time.monotonic() - sent
            # interval + slack: on a shared 2-core machine a commit of 10,000 rows takes a few seconds
            assert fresh < 1.0 + 8.0, fresh
            expected = await topic_rows(client, topic)
        got = table_rows(broker, topic)
        assert got.num_rows == 20_000 and got.equals(expected)
        tbl = handle(broker, topic)
        paths = [t.file.file_path.removeprefix("file://") for t in tbl.scan().plan_files()]
        via_duck = (
            duckdb.connect()
            .sql(f'select "offset", value from read_parquet({paths!r}) order by "offset"')
            .fetchall()
        )
        assert via_duck == list(
            zip(expected.column("offset").to_pylist(), expected.column("value").to_pylist(), strict=True)
        )
        props = tbl.current_snapshot().summary.additional_properties
        assert props["ister.offset.end"] == "20000"
        # a slow trickle: one small tail file per interval, in one WAL segment; once that segment is
        # exported its files are replaced by one (compaction), rows unchanged
        async with Client(broker.url) as client:
            for i in range(4):
                await publish(client, topic, 50, f"slow{i}")
                n = 20_000 + 50 * (i + 1)
                await until(lambda n=n: count_rows(broker, topic) == n, "a tail commit", 30)

            def compacted() -> bool:
                snaps = handle(broker, topic).snapshots()
                return "compact" in [s.summary.additional_properties.get("ister.op") for s in snaps]

            await until(compacted, "a compaction", 60)
            expected = await topic_rows(client, topic)
        assert table_rows(broker, topic).equals(expected)
        described = cli("admin", "topics", "describe", topic, "--admin-addr", broker.admin_addr).stdout
        assert "Table:" in described and "iceberg lake.events" in described, described
        text = cli("table", topic, "--admin-addr", broker.admin_addr).stdout
        assert "load_catalog" in text and "# duckdb" in text and "# spark" in text
        duck = text.split("# duckdb\n", 1)[1].split("\n# spark", 1)[0]  # the printed snippet, run as is
        assert run_snippet(duck) == f"[({expected.num_rows}, {expected.num_rows - 1})]"
        cli("admin", "topics", "set-table", topic, "--format", "none", "--admin-addr", broker.admin_addr)
        off = cli("table", topic, "--admin-addr", broker.admin_addr, ok=False)
        assert off.returncode == 1 and "not kept as a table" in off.stderr
    finally:
        broker.stop()


async def test_kill9_after_write_then_after_commit_keeps_rows_exact(tmp_path: Path) -> None:
    """kill -9 between writing the data file and the catalog commit, restart; kill -9 right after the next
    commit (before the broker sees its answer), restart: every row once."""
    broker = start(tmp_path, ISTER_TABLES_FAULT="after-write")
    topic = f"/{NS}/crash"

    async def killed(step: str) -> None:
        await until(
            lambda: broker.proc is not None and broker.proc.poll() is not None, "kill -9 at " + step, 60
        )
        broker.proc = None

    try:
        async with Client(broker.url) as client:
            await publish(client, topic, 3_000)
        cli(
            "admin",
            "topics",
            "set-table",
            topic,
            "--format",
            "iceberg",
            "--interval",
            "1s",
            "--admin-addr",
            broker.admin_addr,
        )
        await killed("after-write")
        assert offline_rows(broker, topic) == 0  # the file was written, the catalog names none
        broker.env["ISTER_TABLES_FAULT"] = "after-commit"
        broker.start()
        async with Client(broker.url) as client:
            await publish(client, topic, 1_000, "second")
        await killed("after-commit")
        assert offline_rows(broker, topic) >= 3_000  # that commit landed
        broker.env.pop("ISTER_TABLES_FAULT")
        broker.start()
        async with Client(broker.url) as client:
            await publish(client, topic, 1_000, "after")
            await until(lambda: count_rows(broker, topic) == 5_000, "every row once after the restarts", 60)
            expected = await topic_rows(client, topic)
        assert table_rows(broker, topic).equals(expected)
    finally:
        broker.stop()


async def test_retention_removes_rows_and_files(tmp_path: Path) -> None:
    broker = start(
        tmp_path,
        ISTER_STORAGE__RETENTION__CHECK_INTERVAL_SECONDS="0.3",
        ISTER_WAL__SEGMENT_MAX_BYTES="16384",
        ISTER_TABLES__SNAPSHOT_KEEP_SECONDS="1",
    )
    topic = f"/{NS}/old"
    try:
        cli(
            "admin",
            "namespaces",
            "set-table",
            NS,
            "--format",
            "iceberg",
            "--interval",
            "1s",
            "--admin-addr",
            broker.admin_addr,
        )
        async with Client(broker.url) as client:
            await publish(client, topic, 3_000)
            await until(lambda: count_rows(broker, topic) == 3_000, "committed", 60)
            first_files = {t.file.file_path for t in handle(broker, topic).scan().plan_files()}
            cli("admin", "topics", "set-retention", topic, "--time", "1s", "--admin-addr", broker.admin_addr)

            async def moved() -> bool:
                return (await client.offsets(topic)).earliest == 3_000

            await until(moved, "retention deleted the first 3,000 records", 60)
            cli("admin", "topics", "set-retention", topic, "--time", "1h", "--admin-addr", broker.admin_addr)
            await publish(client, topic, 500, "later")

            def trimmed() -> bool:
                rows = table_rows(broker, topic).column("offset").to_pylist()
                return rows == list(range(3_000, 3_500))

            await until(trimmed, "the table holds what the topic holds", 60)
            gone = lambda: all(not Path(p.removeprefix("file://")).exists() for p in first_files)  # noqa: E731
            await until(gone, "the first data files deleted", 60)
            span = await client.offsets(topic)
            expected = [r async for b in client.read(topic, span.earliest, span.next) for r in b]
        assert table_rows(broker, topic).equals(to_arrow(BYTES_SHAPE, expected))
    finally:
        broker.stop()


async def test_catalog_outage_waits_then_commits_everything_once(tmp_path: Path) -> None:
    broker = start(tmp_path)
    topic = f"/{NS}/outage"
    db = broker.data_dir / "tables" / "catalog.db"
    try:
        cli(
            "admin",
            "namespaces",
            "set-table",
            NS,
            "--format",
            "iceberg",
            "--interval",
            "1s",
            "--admin-addr",
            broker.admin_addr,
        )
        async with Client(broker.url) as client:
            await publish(client, topic, 2_000)
            await until(lambda: count_rows(broker, topic) == 2_000, "committed", 60)
            lock = sqlite3.connect(db, isolation_level=None, timeout=30)
            lock.execute("BEGIN EXCLUSIVE")  # the catalog is unavailable: every read and write waits
            try:
                await publish(client, topic, 3_000, "during")
                await until(lambda: _failed(broker) >= 1, "a commit failed during the outage", 60)
            finally:
                lock.execute("COMMIT")
                lock.close()
            await until(lambda: count_rows(broker, topic) == 5_000, "everything committed after", 60)
            expected = await topic_rows(client, topic)
        assert table_rows(broker, topic).equals(expected)
    finally:
        broker.stop()


def _failed(broker: BrokerProcess) -> float:
    from tests.integration.harness import broker_metric

    return broker_metric(broker.metrics_url, "ister_table_commits_total", op="append", result="failed") or 0.0


with contextlib.suppress(ImportError):
    asyncio  # noqa: B018 (kept for the event loop fixtures' import)


TRADE_V1 = {
    "type": "record",
    "name": "Trade",
    "fields": [{"name": "id", "type": "long"}, {"name": "sym", "type": "string"}],
}
TRADE_V2 = {
    **TRADE_V1,
    "fields": [*TRADE_V1["fields"], {"name": "qty", "type": ["null", "int"], "default": None}],
}
READING = {"type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string"}}}
ENVELOPE_COLUMNS = ["offset", "publish_time", "key", "producer", "attributes"]


def duck(broker: BrokerProcess, topic: str, columns: str) -> list[tuple[Any, ...]]:
    files = [t.file.file_path.removeprefix("file://") for t in handle(broker, topic).scan().plan_files()]
    query = f'select {columns} from read_parquet({files!r}, union_by_name = true) order by "offset"'
    return duckdb.connect().sql(query).fetchall()


def envelope_equal(broker: BrokerProcess, topic: str, expected: pa.Table) -> bool:
    return table_rows(broker, topic).select(ENVELOPE_COLUMNS).equals(expected.select(ENVELOPE_COLUMNS))


async def test_typed_avro_and_json_tables_evolution_and_zstd(tmp_path: Path) -> None:
    """Avro and JSON Schema topics get their fields as columns; an added optional field registered
    mid-stream evolves the Avro table (older rows null there, a v1 record sent after v2 still typed); a
    zstd-compressed topic's table holds its plain rows."""
    broker = start(tmp_path)
    trades, readings, packed = f"/{NS}/trades", f"/{NS}/readings", f"/{NS}/packed"
    try:
        cli("admin", "namespaces", "set-table", NS, "--format", "iceberg", "--interval", "1s",
            "--admin-addr", broker.admin_addr)  # fmt: skip
        async with Client(broker.url) as client:
            await client.schemas.register("trades", "avro", json.dumps(TRADE_V1))
            await client.schemas.register("readings", "json_schema", json.dumps(READING))
            old = await client.producer(trades, schema_subject="trades")
            assert old.schema is not None
            enc1 = old.schema.schema.encode
            await old.send_batch([enc1({"id": i, "sym": f"s{i}"}) for i in range(200)])
            js = await client.producer(readings, schema_subject="readings")
            await js.send_batch([json.dumps({"n": i, "s": f"r{i}"}).encode() for i in range(150)])
            zs = await client.producer(packed, compression="zstd")
            sent = [f"z{i}".encode() * 20 for i in range(300)]
            await zs.send_batch(sent)
            await until(lambda: count_rows(broker, trades) == 200, "the v1 rows committed", 90)

            assert (await client.schemas.register("trades", "avro", json.dumps(TRADE_V2))).version == 2
            new = await client.producer(trades, schema_subject="trades")
            assert new.schema is not None and new.schema.version == 2
            enc2 = new.schema.schema.encode
            await new.send_batch([enc2({"id": i, "sym": f"s{i}", "qty": i}) for i in range(200, 300)])
            await old.send_batch([enc1({"id": i, "sym": f"s{i}"}) for i in range(300, 350)])
            for topic, n in ((trades, 350), (readings, 150), (packed, 300)):
                await until(lambda t=topic, n=n: count_rows(broker, t) == n, f"{topic} committed", 60)
            topic_of = {t: await topic_rows(client, t) for t in (trades, readings, packed)}

        table = handle(broker, trades)
        assert [f.name for f in table.schema().fields] == [
            *ENVELOPE_COLUMNS,
            "_raw",
            "_error",
            "id",
            "sym",
            "qty",
        ]
        expected = [(i, i, f"s{i}", i if 200 <= i < 300 else None) for i in range(350)]
        got = table_rows(broker, trades)
        assert got.column("_error").null_count == 350
        assert (
            list(zip(*(got.column(c).to_pylist() for c in ("offset", "id", "sym", "qty")), strict=True))
            == expected
        )
        assert duck(broker, trades, '"offset", id, sym, qty') == expected
        assert envelope_equal(broker, trades, topic_of[trades])

        assert [f.name for f in handle(broker, readings).schema().fields][-2:] == ["n", "s"]
        assert duck(broker, readings, '"offset", n, s') == [(i, i, f"r{i}") for i in range(150)]
        assert envelope_equal(broker, readings, topic_of[readings])

        rows = table_rows(broker, packed)
        assert rows.equals(topic_of[packed]) and rows.column("value").to_pylist() == sent
    finally:
        broker.stop()
