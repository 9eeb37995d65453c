"""Operations of a topic's Iceberg table with real broker processes (issue 44, docs/tables.md): the orphan
sweep deleting a stray data file while the table keeps every row, retention waking the committer, a
Protobuf topic's typed table, and what deleting a topic does to its table."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import duckdb
import pytest
from pyiceberg.exceptions import NoSuchTableError

from ister.client import Client
from ister.devcluster.ports import free_port
from ister.tables.catalog import CatalogSpec, open_catalog
from ister.tables.committer import TableWriter, read_rows
from ister.tables.shapes import BYTES_SHAPE
from ister.tables.typed import to_arrow
from tests.integration.harness import BrokerProcess, broker_metric
from tests.integration.test_tables import (
    NS,
    cli,
    count_rows,
    envelope_equal,
    handle,
    publish,
    start,
    table_rows,
    topic_rows,
)
from tests.seaweed_server import ACCESS_KEY, REGION, SECRET_KEY, SeaweedServer
from tests.support import until
from tests.unit.test_tables_committer import records as unit_records

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

HOUR = 3600.0


def set_table(broker: BrokerProcess, *args: str) -> None:
    cli("admin", *args, "--format", "iceberg", "--admin-addr", broker.admin_addr)


def metric(broker: BrokerProcess, name: str, **labels: str) -> float:
    return broker_metric(broker.metrics_url, name, **labels) or 0.0


def stray(table: Any, name: str, age: float) -> Path:
    """A copy of one of the table's data files under another name (no snapshot names it), `age` s old."""
    named = Path(table.scan().plan_files()[0].file.file_path.removeprefix("file://"))
    path = named.parent / name
    shutil.copyfile(named, path)
    then = time.time() - age
    os.utime(path, (then, then))
    return path


def chattr(flag: str, path: Path) -> bool:
    """Set or clear the immutable attribute (an immutable file cannot be deleted, even by root)."""
    return subprocess.run(["chattr", flag, str(path)], check=False).returncode == 0


@pytest.mark.skipif(shutil.which("chattr") is None, reason="needs chattr (an immutable file)")
async def test_orphan_sweep_deletes_old_strays_and_keeps_rows(tmp_path: Path) -> None:
    broker = start(
        tmp_path,
        ISTER_TABLES__ORPHAN_MIN_AGE_SECONDS="600",
        ISTER_TABLES__ORPHAN_SWEEP_INTERVAL_SECONDS="1",
    )
    topic = f"/{NS}/swept"
    try:
        set_table(broker, "namespaces", "set-table", NS, "--interval", "1s")
        async with Client(broker.url) as client:
            await publish(client, topic, 2_000)
            await until(lambda: count_rows(broker, topic) == 2_000, "committed", 60)
            table = handle(broker, topic)
            old = stray(table, "00000-0-crashed-before-commit.parquet", HOUR)
            young = stray(table, "00000-0-commit-in-flight.parquet", 5)
            stuck = stray(table, "00000-0-immutable.parquet", HOUR)
            if not chattr("+i", stuck):
                pytest.skip("the filesystem has no immutable attribute")
            try:
                failed = metric(broker, "ister_table_orphan_sweeps_total", result="failed")
                await until(lambda: not old.exists(), "the old stray file deleted", 30)
                # the immutable one cannot go (EPERM even for root): counted, left as it is
                await until(
                    lambda: metric(broker, "ister_table_orphan_sweeps_total", result="failed") > failed,
                    "a failed sweep counted",
                    30,
                )
                assert stuck.exists() and young.exists()
                named = snapshot_files(handle(broker, topic))  # each still there: none deleted
                assert all_on_disk(named)
                assert table_rows(broker, topic).equals(await topic_rows(client, topic))
            finally:
                assert chattr("-i", stuck)
            ok = metric(broker, "ister_table_orphan_sweeps_total", result="ok")
            await until(lambda: not stuck.exists(), "the stray file deleted once it can be", 30)
            await until(
                lambda: metric(broker, "ister_table_orphan_sweeps_total", result="ok") > ok,
                "a clean sweep",
                30,
            )
            assert young.exists()  # younger than the minimum age: maybe a commit in flight
            assert metric(broker, "ister_table_orphan_files_deleted_total") == 2
            await publish(client, topic, 500, "more")
            await until(lambda: count_rows(broker, topic) == 2_500, "later commits", 60)
            assert table_rows(broker, topic).equals(await topic_rows(client, topic))
    finally:
        broker.stop()


async def test_retention_wakes_the_committer(tmp_path: Path) -> None:
    """With an hour between commits, what retention deletes from the topic leaves the table within seconds."""
    broker = start(
        tmp_path,
        ISTER_STORAGE__RETENTION__CHECK_INTERVAL_SECONDS="0.3",
        ISTER_WAL__SEGMENT_MAX_BYTES="16384",
    )
    topic = f"/{NS}/woken"
    try:
        async with Client(broker.url) as client:
            await publish(client, topic, 3_000)
            # the committer's first pass commits the backlog; the next one would be an hour later
            set_table(broker, "topics", "set-table", topic, "--interval", "1h")
            await until(lambda: count_rows(broker, topic) == 3_000, "the backlog committed", 60)
            cli("admin", "topics", "set-retention", topic, "--time", "1s", "--admin-addr", broker.admin_addr)

            async def moved() -> bool:
                return (await client.offsets(topic)).earliest == 3_000

            await until(moved, "retention deleted the topic's records", 60)
            began = time.monotonic()
            await until(lambda: count_rows(broker, topic) == 0, "the table dropped them too", 20)
            took = time.monotonic() - began
        print(f"table emptied {took:.2f} s after the start offset moved (commit interval 1 h)")
        ops = [s.summary.additional_properties.get("ister.op") for s in handle(broker, topic).snapshots()]
        assert ops[-1] == "retention"
    finally:
        broker.stop()


ORDER_PROTO = """syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
message Order {
  int64 id = 1;
  string item = 2;
  double price = 3;
  Status status = 4;
  repeated string tags = 5;
  Address ship = 6;
  google.protobuf.Timestamp at = 7;
  optional int32 qty = 8;
}
enum Status { NEW = 0; PAID = 1; }
message Address { string city = 1; int32 zip = 2; }
"""


async def test_protobuf_topic_table(tmp_path: Path) -> None:
    """A topic bound to a Protobuf subject: the message's fields are the table's columns."""
    import datetime as dt

    broker = start(tmp_path)
    topic = f"/{NS}/orders"
    try:
        set_table(broker, "namespaces", "set-table", NS, "--interval", "1s")
        async with Client(broker.url) as client:
            await client.schemas.register("orders", "protobuf", ORDER_PROTO)
            producer = await client.producer(topic, schema_subject="orders")
            assert producer.schema is not None
            encode = producer.schema.schema.encode

            def order(i: int) -> dict[str, Any]:
                if i % 5 == 0:
                    return {"id": i}  # proto3 defaults; unset message and optional field: null
                return {
                    "id": i,
                    "item": f"item{i}",
                    "price": i / 4,
                    "status": "PAID" if i % 2 else "NEW",
                    "tags": [f"t{i}"] * (i % 3),
                    "ship": {"city": f"c{i}", "zip": i},
                    "at": f"2026-12-06T00:00:{i % 60:02d}Z",
                    "qty": i % 7,
                }

            await producer.send_batch([encode(order(i)) for i in range(400)])
            await until(lambda: count_rows(broker, topic) == 400, "the Protobuf rows committed", 90)
            expected_envelope = await topic_rows(client, topic)

        table = handle(broker, topic)
        names = [f.name for f in table.schema().fields]
        assert names[-8:] == ["id", "item", "price", "status", "tags", "ship", "at", "qty"]
        got = table_rows(broker, topic)
        assert got.column("_error").null_count == 400
        assert envelope_equal(broker, topic, expected_envelope)
        for row in got.to_pylist():
            i = row["offset"]
            assert row["id"] == i
            if i % 5 == 0:
                assert (row["item"], row["price"], row["status"], row["tags"]) == ("", 0.0, "NEW", [])
                assert row["ship"] is None and row["at"] is None and row["qty"] is None
                continue
            assert (row["item"], row["price"], row["status"]) == (
                f"item{i}",
                i / 4,
                "PAID" if i % 2 else "NEW",
            )
            assert row["tags"] == [f"t{i}"] * (i % 3) and row["ship"] == {"city": f"c{i}", "zip": i}
            assert row["at"] == dt.datetime(2026, 12, 6, 0, 0, i % 60, tzinfo=dt.UTC)
            assert row["qty"] == i % 7
        files = [t.file.file_path.removeprefix("file://") for t in table.scan().plan_files()]
        via_duck = (
            duckdb.connect()
            .sql(f'select "offset", id, item, ship.city from read_parquet({files!r}) order by "offset"')
            .fetchall()
        )
        assert via_duck == [
            (i, i, "" if i % 5 == 0 else f"item{i}", None if i % 5 == 0 else f"c{i}") for i in range(400)
        ]
    finally:
        broker.stop()


def snapshot_files(table: Any) -> set[str]:
    """The data files any snapshot of the table names."""
    return {
        entry.data_file.file_path
        for snap in table.snapshots()
        for manifest in snap.manifests(table.io)
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
    }


def all_on_disk(uris: set[str]) -> bool:
    return all(Path(p.removeprefix("file://")).exists() for p in uris)


def catalog_of(broker: BrokerProcess) -> Any:
    from pyiceberg.catalog import load_catalog

    return load_catalog("ister", uri=f"sqlite:///{broker.data_dir.resolve()}/tables/catalog.db")


async def test_deleting_a_topic_keeps_its_table(tmp_path: Path) -> None:
    """A deleted topic's table stays readable; a topic created again under the name gets a new table, the
    old one kept beside it as `<topic>-deleted-<revision>`; the deleted topic's own table policy is gone."""
    broker = start(tmp_path)
    topic = f"/{NS}/churn"
    try:
        set_table(broker, "namespaces", "set-table", NS, "--interval", "1s")
        async with Client(broker.url) as client:
            await publish(client, topic, 300, "old")
            set_table(broker, "topics", "set-table", topic, "--partition", "hour")
            await until(lambda: count_rows(broker, topic) == 300, "the first topic's rows committed", 60)
            old_rows = table_rows(broker, topic)
        cli("admin", "topics", "delete", topic, "--admin-addr", broker.admin_addr)
        kept = catalog_of(broker).load_table((NS, "churn"))
        assert kept.scan().to_arrow().sort_by("offset").equals(old_rows)  # kept, readable

        async with Client(broker.url) as client:
            await publish(client, topic, 100, "new")  # the same name again: offsets from 0
            shown = cli("admin", "topics", "table", topic, "--admin-addr", broker.admin_addr).stdout
            assert "hour" not in shown, shown  # the deleted topic's own policy went with it

            def renamed() -> list[str]:
                return [t[1] for t in catalog_of(broker).list_tables(NS) if t[1].startswith("churn-deleted-")]

            await until(lambda: len(renamed()) == 1, "the old table renamed out of the way", 60)

            def new_rows() -> list[bytes]:
                try:
                    table = catalog_of(broker).load_table((NS, "churn"))
                except NoSuchTableError:  # renamed, and the new one not created yet: two catalog calls
                    return []
                rows = table.scan().to_arrow().sort_by("offset")
                return rows.column("value").to_pylist()  # type: ignore[no-any-return]

            await until(lambda: len(new_rows()) == 100, "the new topic's rows in a new table", 60)
            expected = await topic_rows(client, topic)
        catalog = catalog_of(broker)
        new = catalog.load_table((NS, "churn")).scan().to_arrow().sort_by("offset")
        assert new.equals(expected) and new.column("offset").to_pylist() == list(range(100))
        old = catalog.load_table((NS, renamed()[0]))
        assert old.scan().to_arrow().sort_by("offset").equals(old_rows)
        assert old.location() != catalog.load_table((NS, "churn")).location()
        found = json.loads(cli("table", topic, "--admin-addr", broker.admin_addr, "-o", "json").stdout)
        assert found["table"] == f"{NS}.churn"
    finally:
        broker.stop()


async def test_orphan_sweep_on_s3(tmp_path: Path, seaweed: SeaweedServer) -> None:
    """The sweep through the table's FileIO on S3 (SeaweedFS): strays deleted once old enough, every file a
    snapshot names kept; a listing that fails (the store unreachable) raises and deletes nothing."""
    from pyiceberg.io.pyarrow import PyArrowFileIO

    props = {
        "s3.endpoint": seaweed.endpoint,
        "s3.region": REGION,
        "s3.access-key-id": ACCESS_KEY,
        "s3.secret-access-key": SECRET_KEY,
    }
    warehouse = f"{seaweed.url}/{uuid.uuid4().hex[:8]}/tables"
    spec = CatalogSpec(f"sqlite:///{tmp_path / 'cat.db'}", warehouse, props)
    w = TableWriter(open_catalog(spec), (NS, "remote"), BYTES_SHAPE, "day")
    for first in (0, 100):
        w.append(to_arrow(BYTES_SHAPE, unit_records(first, 100)), first, first + 100, 1)
    named = w._all_files()
    assert len(named) == 2 and all(p.startswith(warehouse) for p in named)
    fs = w.table.io.fs_by_scheme("s3", seaweed.bucket)
    source = next(iter(named)).removeprefix("s3://")
    strays = [f"{source.rsplit('/', 1)[0]}/00000-0-stray{i}.parquet" for i in range(2)]
    for path in strays:
        fs.copy_file(source, path)

    def exists(path: str) -> bool:
        from pyarrow.fs import FileType

        return bool(fs.get_file_info(path).type == FileType.File)

    assert w.sweep(HOUR).deleted == []  # just written: younger than the minimum age
    good_io = w.table.io
    dead = {**props, "s3.endpoint": f"http://127.0.0.1:{free_port()}", "s3.connect-timeout": "1"}
    w.table.io = PyArrowFileIO(dead)
    with pytest.raises(OSError):
        w.sweep(0, now=time.time() + 2 * HOUR)
    assert all(exists(p) for p in strays)
    w.table.io = good_io
    result = w.sweep(HOUR, now=time.time() + 2 * HOUR)
    assert result.error is None and sorted(result.deleted) == sorted(f"s3://{p}" for p in strays)
    assert not any(exists(p) for p in strays)
    assert all(exists(p.removeprefix("s3://")) for p in named)
    assert read_rows(w.table).column("offset").to_pylist() == list(range(200))


async def test_a_crash_before_the_commit_leaves_an_orphan_the_sweep_deletes(tmp_path: Path) -> None:
    """kill -9 between writing a data file and committing it (ISTER_TABLES_FAULT=after-write): the file is
    in the warehouse, named by no snapshot; after the restart the range is committed again in a new file
    and, once the orphan is older than the minimum age, the sweep deletes it. Rows: exact."""
    broker = start(
        tmp_path,
        ISTER_TABLES_FAULT="after-write",
        ISTER_TABLES__ORPHAN_MIN_AGE_SECONDS="3",
        ISTER_TABLES__ORPHAN_SWEEP_INTERVAL_SECONDS="1",
    )
    topic = f"/{NS}/crashed"
    try:
        async with Client(broker.url) as client:
            await publish(client, topic, 1_000)
        set_table(broker, "topics", "set-table", topic, "--interval", "1s")
        await until(lambda: broker.proc is not None and broker.proc.poll() is not None, "kill -9", 60)
        broker.proc = None
        table = catalog_of(broker).load_table((NS, "crashed"))
        assert table.current_snapshot() is None
        data = Path(table.location().removeprefix("file://")) / "data"
        [orphan] = list(data.rglob("*.parquet"))  # written, never committed
        broker.env.pop("ISTER_TABLES_FAULT")
        broker.start()
        async with Client(broker.url) as client:
            await publish(client, topic, 100, "after")  # loads the topic (and its committer) again
            await until(lambda: count_rows(broker, topic) == 1_100, "the range committed again", 60)
            await until(lambda: not orphan.exists(), "the orphan swept", 30)
            # every Parquet file left is one a snapshot names (older snapshots too: a compaction's inputs)
            assert {f"file://{p}" for p in data.rglob("*.parquet")} <= snapshot_files(handle(broker, topic))
            assert table_rows(broker, topic).equals(await topic_rows(client, topic))
        assert metric(broker, "ister_table_orphan_files_deleted_total") == 1
    finally:
        broker.stop()
