"""The table writer's view of its table (tables/committer.py): no catalog read per commit or per pass, the
file list kept per snapshot, and a view another writer made stale refused at its commit (nothing doubled,
nothing lost), on a real pyiceberg SQL catalog (SQLite, local warehouse) and a real WAL."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pyiceberg.exceptions import CommitFailedException

from ister.broker.tables import TableKeeper, TopicCommitter, table_commits
from ister.config import TablesSettings
from ister.errors import Fenced
from ister.ids import TopicName
from ister.storage.wal import Wal
from ister.tables.catalog import CatalogSpec, open_catalog
from ister.tables.committer import TableWriter, read_rows
from ister.tables.policy import TablePolicy
from ister.tables.shapes import BYTES_SHAPE
from ister.tables.typed import to_arrow
from tests.support import until
from tests.unit.test_tables_committer import append, records


def spec_of(tmp_path: Path) -> CatalogSpec:
    return CatalogSpec(f"sqlite:///{tmp_path / 'cat.db'}", (tmp_path / "wh").as_uri())


def writer(tmp_path: Path) -> TableWriter:
    return TableWriter(open_catalog(spec_of(tmp_path)), ("default", "events"), BYTES_SHAPE, "day")


def offsets(w: TableWriter) -> list[int]:
    w.table.refresh()
    return [r["offset"] for r in read_rows(w.table, ["offset"]).to_pylist()]


def test_appends_and_passes_read_no_table_metadata_from_the_catalog(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = writer(tmp_path)
    loads: list[Any] = []
    real = w.catalog.load_table

    def load_table(ident: Any) -> Any:
        loads.append(ident)
        return real(ident)

    monkeypatch.setattr(w.catalog, "load_table", load_table)
    for first in range(0, 30, 10):
        assert append(w, first, 10) == 10
        assert w.state().end == first + 10
        w.files()
    # one load per commit: the SQL catalog's own check of the head it commits on; none for the writer's reads
    assert len(loads) == 3
    assert offsets(w) == list(range(30))


def test_the_file_list_follows_appends_compaction_and_retention(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = writer(tmp_path)
    append(w, 0, 10)
    assert [(f.first, f.last, f.rows) for f in w.files()] == [(0, 9, 10)]
    for first in range(10, 40, 10):
        append(w, first, 10)
    scans: list[int] = []
    real = w._scan_files

    def scan() -> Any:
        scans.append(1)
        return real()

    monkeypatch.setattr(w, "_scan_files", scan)
    listed = w.files()  # three appends since the last list: their files are read, not every manifest
    assert scans == []
    assert listed == writer(tmp_path)._scan_files()  # what a full scan of a freshly loaded table gives
    assert [(f.first, f.last) for f in listed] == [(0, 9), (10, 19), (20, 29), (30, 39)]
    assert w.compact(0, 29, epoch=1) == 3
    assert [(f.first, f.last) for f in w.files()] == [(0, 29), (30, 39)]  # not an append: scanned
    assert w.drop_below(30, epoch=1) == 1
    assert [(f.first, f.last) for f in w.files()] == [(30, 39)]
    assert w.files() == writer(tmp_path)._scan_files()
    assert offsets(w) == list(range(30, 40))


def test_a_view_made_stale_by_another_writer_is_refused_nothing_doubled_nothing_lost(tmp_path: Path) -> None:
    a = writer(tmp_path)
    append(a, 0, 10)
    b = writer(tmp_path)  # another writer at the same epoch (a tool, or this broker's earlier writer)
    append(b, 10, 10)
    assert a.state().end == 10  # a's view: its own last commit
    with pytest.raises(CommitFailedException):  # committed on the head a saw: refused, nothing lands
        append(a, 10, 20)
    assert offsets(b) == list(range(20))
    again = writer(tmp_path)  # the committer reopens the table after a failed pass
    assert again.state().end == 20
    assert append(again, 10, 20) == 10  # only 20..29 are new
    assert offsets(again) == list(range(30))


def test_a_deposed_writers_stale_view_is_refused_then_fenced(tmp_path: Path) -> None:
    old = writer(tmp_path)
    append(old, 0, 10, epoch=1)
    new = writer(tmp_path)
    append(new, 10, 5, epoch=2)  # a new owner at a higher epoch
    with pytest.raises(CommitFailedException):
        append(old, 10, 10, epoch=1)  # its view still says epoch 1: the conditional commit refuses it
    with pytest.raises(Fenced):
        append(writer(tmp_path), 10, 10, epoch=1)  # reopened: fenced before writing anything
    assert offsets(new) == list(range(15))


class Storage:
    async def earliest(self, name: TopicName, wal: Wal) -> int:
        return wal.first_offset

    def reader(self, name: TopicName, wal: Wal, start: int) -> Any:
        return wal.reader(start)


async def test_a_committer_whose_worker_view_went_stale_retries_from_the_table(tmp_path: Path) -> None:
    """The worker keeps its writer between passes; another commit lands meanwhile. The next pass's append
    is refused (counted as failed), the pass after it reopens the table and commits the rest: every row
    once."""
    wal = await Wal.open(tmp_path / "wal")
    spec = spec_of(tmp_path)
    keeper = TableKeeper(
        None,  # type: ignore[arg-type]  # the policy cache: not used by a committer made here
        Storage(),  # type: ignore[arg-type]
        list,
        lambda: spec,
        TablesSettings(worker_process=False),
    )
    topic = SimpleNamespace(
        name=TopicName.parse("/default/events"),
        wal=wal,
        claim=SimpleNamespace(epoch=1),
        start_offset=0,
        exporter=None,
    )
    committer = TopicCommitter(keeper, topic, TablePolicy(format="iceberg", interval_ms=1_000))  # type: ignore[arg-type]
    stored = [r for _, r in records(0, 60)]
    task: asyncio.Task[None] | None = None
    try:
        await wal.append(stored[:20])
        assert await committer.run_once() == 20
        # another writer commits 20..29 (what a tool or an earlier writer of this table might do)
        other = TableWriter(open_catalog(spec), ("default", "events"), BYTES_SHAPE, "day")
        assert other.append(to_arrow(BYTES_SHAPE, records(20, 10)), 20, 30, 1) == 10
        await wal.append(stored[20:60])
        failed = table_commits.labels("append", "failed")._value.get()
        task = asyncio.create_task(committer.run())
        await until(lambda: committer.committed_end == 60, "the committer reaching offset 60")
        assert table_commits.labels("append", "failed")._value.get() == failed + 1  # the stale pass
        assert offsets(other) == list(range(60))
    finally:
        if task is not None:
            task.cancel()
        await keeper.close()
        await wal.close()


def test_a_transaction_works_out_its_metadata_once_per_set_of_staged_updates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pyiceberg applies the staged updates to a deep copy of the table's metadata at every access of
    `Transaction.table_metadata` (23 per append); `transaction()` keeps the result until the table's
    metadata or the staged updates change, and hands out the table's own while nothing is staged."""
    import pyiceberg.table

    from ister.tables.transaction import transaction

    w = writer(tmp_path)
    append(w, 0, 10)
    tx = transaction(w.table)
    first = tx.table_metadata
    assert first is w.table.metadata  # nothing staged: the table's own, uncopied
    tx.set_properties(note="kept")  # staged: the metadata is worked out again, with it
    staged = tx.table_metadata
    assert staged is not first and staged.properties["note"] == "kept"
    assert tx.table_metadata is staged  # worked out once
    tx.commit_transaction()
    assert w.table.metadata.properties["note"] == "kept"
    calls: list[int] = []
    real = pyiceberg.table.update_table_metadata

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(pyiceberg.table, "update_table_metadata", counted)
    assert append(w, 10, 10) == 10
    assert len(calls) == 1  # an append's transaction works it out once (pyiceberg's own: 23 times)
    assert offsets(w) == list(range(20))


def test_write_properties_are_given_to_new_tables_and_to_tables_made_before_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ister.tables import committer

    dict_size = "write.parquet.dict-size-bytes"
    assert writer(tmp_path / "new").table.properties[dict_size] == "65536"
    monkeypatch.setattr(committer, "WRITE_PROPERTIES", {})
    old = writer(tmp_path)  # a table made before the property was given
    append(old, 0, 10)
    assert dict_size not in old.table.properties
    monkeypatch.undo()
    reopened = writer(tmp_path)
    assert reopened.table.properties[dict_size] == "65536"
    assert append(reopened, 10, 20_000) == 20_000
    assert offsets(reopened) == list(range(20_010))
    assert writer(tmp_path).table.properties[dict_size] == "65536"  # committed: a reload has it


def test_rows_put_in_offset_order_by_their_chunks_and_sorted_only_when_files_overlap() -> None:
    import pyarrow as pa

    from ister.tables.committer import in_offset_order

    def batch(*offsets: int) -> pa.RecordBatch:
        return pa.record_batch({"offset": pa.array(offsets, pa.int64()), "v": [f"v{o}" for o in offsets]})

    files = pa.Table.from_batches([batch(20, 21), batch(0, 1, 2), batch(10, 11)])
    ordered = in_offset_order(files)
    assert ordered.column("offset").to_pylist() == [0, 1, 2, 10, 11, 20, 21]
    assert ordered.column("v").to_pylist() == [f"v{o}" for o in (0, 1, 2, 10, 11, 20, 21)]
    overlapping = pa.Table.from_batches([batch(1, 4, 5), batch(0, 2, 3)])  # one append in two partitions
    assert in_offset_order(overlapping).column("offset").to_pylist() == [0, 1, 2, 3, 4, 5]
    empty = pa.Table.from_batches([], schema=batch(0).schema)
    assert in_offset_order(empty).num_rows == 0
    assert in_offset_order(pa.Table.from_batches([batch(7)])).column("offset").to_pylist() == [7]


def test_write_properties_refused_by_the_catalog_stop_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.table.update import SetPropertiesUpdate

    from ister.tables import committer

    dict_size = "write.parquet.dict-size-bytes"
    with monkeypatch.context() as m:
        m.setattr(committer, "WRITE_PROPERTIES", {})
        append(writer(tmp_path), 0, 10)  # a table made before the property was given
    real = SqlCatalog.commit_table
    refused: list[int] = []

    def commit_table(self: Any, table: Any, requirements: Any, updates: Any) -> Any:
        if any(isinstance(u, SetPropertiesUpdate) for u in updates):
            refused.append(1)
            raise CommitFailedException("the catalog refuses property changes")
        return real(self, table, requirements, updates)

    monkeypatch.setattr(SqlCatalog, "commit_table", commit_table)
    w = writer(tmp_path)  # opens all the same
    assert refused == [1] and dict_size not in w.table.properties
    assert append(w, 10, 10) == 10  # and commits
    monkeypatch.undo()
    assert writer(tmp_path).table.properties[dict_size] == "65536"  # the next opening sets it
    assert offsets(w) == list(range(20))


def test_a_failed_manifest_read_leaves_the_kept_file_lists_as_they_were(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyiceberg.manifest import ManifestFile

    w = writer(tmp_path)
    append(w, 0, 10)
    w.files(), w._all_files()
    append(w, 10, 10)
    real = ManifestFile.fetch_manifest_entry

    def unreadable(*args: Any, **kwargs: Any) -> Any:
        raise OSError("the store is down")

    monkeypatch.setattr(ManifestFile, "fetch_manifest_entry", unreadable)
    with pytest.raises(OSError):
        w.files()  # the new append's manifest cannot be read: the pass fails
    with pytest.raises(OSError):
        w._all_files()
    monkeypatch.setattr(ManifestFile, "fetch_manifest_entry", real)
    assert [(f.first, f.last) for f in w.files()] == [(0, 9), (10, 19)]
    assert w.files() == writer(tmp_path)._scan_files()
    assert w._all_files() == {f.path for f in w.files()}
