"""TableWriter on a real pyiceberg SQL catalog (SQLite + local warehouse): exactly-once appends, fencing,
conditional commits, compaction, retention and snapshot expiry."""

from __future__ import annotations

import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pytest

from ister.core.record import StoredMessage, encode_message
from ister.errors import Fenced
from ister.tables import committer
from ister.tables.catalog import CatalogSpec, open_catalog
from ister.tables.committer import END, EPOCH, TableWriter, read_rows
from ister.tables.shapes import BYTES_SHAPE
from ister.tables.typed import to_arrow

T0_MS = 1_767_000_000_000


def records(first: int, count: int) -> list[tuple[int, bytes]]:
    return [
        (
            o,
            encode_message(
                StoredMessage(
                    f"v{o}".encode(),
                    T0_MS + o * 1000,
                    7,
                    "prod",
                    {"n": str(o)} if o % 2 else {},
                    routing_key=f"k{o}" if o % 3 else None,
                )
            ),
        )
        for o in range(first, first + count)
    ]


def writer(tmp_path: Path, partition: str = "day") -> TableWriter:
    spec = CatalogSpec(f"sqlite:///{tmp_path / 'cat.db'}", (tmp_path / "wh").as_uri())
    return TableWriter(open_catalog(spec), ("default", "events"), BYTES_SHAPE, partition)


def append(w: TableWriter, first: int, count: int, epoch: int = 1) -> int:
    return w.append(to_arrow(BYTES_SHAPE, records(first, count)), first, first + count, epoch)


def test_rows_and_envelope_columns(tmp_path: Path) -> None:
    w = writer(tmp_path)
    assert append(w, 0, 10) == 10
    rows = read_rows(w.table).to_pylist()
    assert [r["offset"] for r in rows] == list(range(10))
    assert rows[1]["value"] == b"v1" and rows[1]["key"] == b"k1" and rows[0]["key"] is None
    assert rows[1]["attributes"] == [("n", "1")] and rows[0]["attributes"] == []
    assert rows[3]["publish_time"] == datetime.fromtimestamp((T0_MS + 3000) / 1000, UTC)
    assert rows[0]["producer"] == "prod"
    props = w.table.current_snapshot().summary.additional_properties
    assert props[END] == "10" and props[EPOCH] == "1"


def test_replayed_commit_adds_nothing(tmp_path: Path) -> None:
    w = writer(tmp_path)
    append(w, 0, 10)
    assert append(w, 0, 10) == 0  # replay after a crash: already there
    assert append(w, 5, 10) == 5  # overlapping: only 10..14 added
    again = writer(tmp_path)  # a restarted broker reads the state from the table
    assert again.state().end == 15
    assert [r["offset"] for r in read_rows(again.table).to_pylist()] == list(range(15))


def test_older_epoch_is_refused(tmp_path: Path) -> None:
    w = writer(tmp_path)
    append(w, 0, 5, epoch=3)
    with pytest.raises(Fenced):
        append(w, 5, 5, epoch=2)
    assert w.state().end == 5


def test_concurrent_writer_conflict_is_refused_not_doubled(tmp_path: Path) -> None:
    from pyiceberg.exceptions import CommitFailedException

    a, b = writer(tmp_path), writer(tmp_path)
    a.state(), b.state()
    tx = b.table.transaction()  # b read the head before a's commit
    tx.append(to_arrow(BYTES_SHAPE, records(0, 5)), snapshot_properties={END: "5", EPOCH: "1"})
    append(a, 0, 5)
    with pytest.raises(CommitFailedException):
        tx.commit_transaction()
    with pytest.raises(CommitFailedException):
        append(b, 0, 5)  # b's view is its own: still the head before a's commit, so refused again
    b = writer(tmp_path)  # the committer reopens the table after a failed pass: the end read again
    assert append(b, 0, 5) == 0  # adds nothing
    assert len(read_rows(b.table)) == 5


def test_compaction_replaces_small_files_keeps_rows(tmp_path: Path) -> None:
    w = writer(tmp_path)
    for first in range(0, 40, 10):
        append(w, first, 10)
    assert len(w.files()) == 4
    before = read_rows(w.table)
    assert w.compact(0, 29, epoch=1) == 3
    ranges = [(f.first, f.last) for f in w.files()]
    assert ranges == [(0, 29), (30, 39)]
    assert read_rows(w.table).equals(before)
    assert w.state().end == 40


def test_retention_then_expiry_deletes_files(tmp_path: Path) -> None:
    w = writer(tmp_path)
    append(w, 0, 10)
    append(w, 10, 10)
    first_file = w.files()[0].path
    assert w.drop_below(10, epoch=1) == 1
    assert [r["offset"] for r in read_rows(w.table).to_pylist()] == list(range(10, 20))
    assert Path(first_file.removeprefix("file://")).exists()  # older snapshots still name it
    gone = w.expire(0, now=datetime.now(UTC) + timedelta(seconds=5))
    assert first_file in gone and not Path(first_file.removeprefix("file://")).exists()
    assert [r["offset"] for r in read_rows(w.table).to_pylist()] == list(range(10, 20))


def test_hour_partitioning_and_duckdb_reads_the_files(tmp_path: Path) -> None:
    w = writer(tmp_path, partition="hour")
    append(w, 0, 7300)  # two hours and a bit of records one second apart
    assert len(w.files()) >= 3
    paths = [f.path.removeprefix("file://") for f in w.files()]
    query = f'select count(*), min("offset"), max("offset") from read_parquet({paths!r})'
    count = duckdb.connect().sql(query)  # its own connection, not the module's shared one
    assert count.fetchall() == [(7300, 0, 7299)]


def test_schema_evolution_adds_an_optional_column(tmp_path: Path) -> None:
    """A JSON Schema topic's table evolved to the subject's next version (an added optional field) keeps
    its field ids; old rows read the new column as null, and records of either version append."""
    import json

    from ister.core.schema import parse, parse_schema_type
    from ister.tables.typed import evolve, table_shape

    def schema(*fields: str) -> Any:
        doc = {"type": "object", "properties": {f: {"type": "integer"} for f in fields}}
        return parse(parse_schema_type("json_schema"), json.dumps(doc))

    def typed(first: int, values: list[dict[str, int]]) -> list[tuple[int, bytes]]:
        return [
            (first + i, encode_message(StoredMessage(json.dumps(v).encode(), T0_MS, 1, "p", {}, None, 0, 1)))
            for i, v in enumerate(values)
        ]

    spec = CatalogSpec(f"sqlite:///{tmp_path / 'cat.db'}", (tmp_path / "wh").as_uri())
    v1 = table_shape(schema("a"), 1)
    w = TableWriter(open_catalog(spec), ("default", "typed"), v1, "day")
    assert w.append(w.rows(typed(0, [{"a": 1}, {"a": 2}])), 0, 2, 1) == 2
    before = {f.name: f.field_id for f in w.table.schema().fields}
    w.evolve_to(evolve(v1, table_shape(schema("a", "b"), 2)))
    assert w.append(w.rows(typed(2, [{"a": 3, "b": 30}])), 2, 3, 1) == 1
    got = read_rows(w.table).to_pylist()
    assert [(r["a"], r["b"]) for r in got] == [(1, None), (2, None), (3, 30)]
    assert {k: v for k, v in ((f.name, f.field_id) for f in w.table.schema().fields) if k in before} == before


def test_compressed_records_give_the_same_rows(tmp_path: Path) -> None:
    """Records stored compressed (docs/compression.md: zstd and gzip envelopes) are decoded before their
    rows are built: the table holds what the plain records give."""
    from ister.core.compression import Codec, wrap

    plain = records(0, 6)
    mixed = [(o, wrap((Codec.ZSTD, Codec.GZIP, Codec.NONE)[o % 3], r)) for o, r in plain]
    assert mixed[0][1] != plain[0][1]
    w = writer(tmp_path)
    assert w.append(w.rows(mixed), 0, 6, 1) == 6
    assert read_rows(w.table).equals(to_arrow(BYTES_SHAPE, plain))


def test_a_bytes_table_bound_to_a_subject_later_takes_typed_rows(tmp_path: Path) -> None:
    """A topic's table begun as bytes, then bound to a JSON Schema subject: the typed columns are added,
    `value` becomes optional (older rows keep their payloads), and typed rows append."""
    import json

    from ister.core.schema import parse, parse_schema_type
    from ister.tables.typed import table_shape

    w = writer(tmp_path)
    append(w, 0, 2)
    doc = {"type": "object", "properties": {"n": {"type": "integer"}}}
    w.evolve_to(table_shape(parse(parse_schema_type("json_schema"), json.dumps(doc)), 1))
    typed = [(2, encode_message(StoredMessage(b'{"n": 5}', T0_MS, 1, "p", {}, None, 0, 1)))]
    assert w.append(w.rows(typed), 2, 3, 1) == 1
    got = read_rows(w.table).to_pylist()
    assert [(r["value"], r["n"]) for r in got] == [(b"v0", None), (b"v1", None), (None, 5)]


def test_compaction_leaves_large_files_and_rewrites_the_small_ones_between(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(committer, "LARGE_FILE_ROWS", 10)
    w = writer(tmp_path)
    append(w, 0, 10)  # large
    append(w, 10, 3)
    append(w, 13, 10)  # large, between two small ones
    append(w, 23, 4)
    append(w, 27, 10)  # large
    before = read_rows(w.table)
    assert w.compact(0, 36, epoch=1) == 3
    assert [(f.first, f.last) for f in w.files()] == [(0, 9), (10, 26), (27, 36)]
    assert read_rows(w.table).equals(before)
    assert w.compact(0, 36, epoch=1) == 0  # no two small files left: nothing to do
    w2 = writer(tmp_path / "only-large")
    append(w2, 0, 10)
    append(w2, 10, 10)
    assert w2.compact(0, 19, epoch=1) == 0 and len(w2.files()) == 2


def test_expiry_deletes_the_expired_snapshots_manifests_and_old_metadata_files(tmp_path: Path) -> None:
    """Each commit writes a metadata file, a manifest list and a manifest: expiry and the commits
    themselves delete what no kept snapshot needs, so a table committed every few seconds does not fill its
    warehouse; every row stays readable."""
    w = writer(tmp_path)
    for first in range(0, 300, 10):
        append(w, first, 10)
    meta = Path(w.table.metadata.location.removeprefix("file://")) / "metadata"

    def files(pattern: str) -> set[Path]:
        return set(meta.glob(pattern))

    assert len(files("*.metadata.json")) <= 11  # the current one and the last 10
    avro_before = files("*.avro")
    kept_before = {Path(s.manifest_list.removeprefix("file://")) for s in w.table.snapshots()}
    assert len(kept_before) == 30
    w.expire(0, now=datetime.now(UTC) + timedelta(seconds=5))
    snapshots = w.table.snapshots()
    assert len(snapshots) == 1  # only the current one is kept
    current = snapshots[0]
    needed = {Path(current.manifest_list.removeprefix("file://"))} | {
        Path(m.manifest_path.removeprefix("file://")) for m in current.manifests(w.table.io)
    }
    left = files("*.avro")
    assert needed <= left  # nothing the kept snapshot needs was deleted
    assert left == needed and len(avro_before) > len(left)  # and everything else was
    assert len(files("*.metadata.json")) <= 11
    assert [r["offset"] for r in read_rows(writer(tmp_path).table).to_pylist()] == list(range(300))
    assert append(w, 300, 10) == 10  # the table goes on
    assert len(read_rows(w.table)) == 310


def _chattr(flag: str, path: Path) -> bool:
    """Set or clear the immutable attribute (an immutable file cannot be deleted, even by root)."""
    return subprocess.run(["chattr", flag, str(path)], check=False, capture_output=True).returncode == 0


@pytest.mark.skipif(shutil.which("chattr") is None, reason="needs chattr (an immutable file)")
def test_expiry_goes_on_past_a_file_it_cannot_delete(tmp_path: Path) -> None:
    """The snapshots are expired before their files are deleted: one that cannot be deleted is left (and
    logged), the others go, and the table stays whole."""
    w = writer(tmp_path)
    for first in range(0, 50, 10):
        append(w, first, 10)
    oldest = min(w.table.snapshots(), key=lambda s: s.timestamp_ms)
    stuck = Path(oldest.manifest_list.removeprefix("file://"))
    if not _chattr("+i", stuck):
        pytest.skip("this filesystem has no immutable attribute")
    try:
        w.expire(0, now=datetime.now(UTC) + timedelta(seconds=5))
        assert stuck.exists()
        others = [Path(s.manifest_list.removeprefix("file://")) for s in w.table.snapshots()]
        left = set(stuck.parent.glob("snap-*.avro"))
        assert left == {stuck, *others}  # every other expired manifest list was deleted
    finally:
        _chattr("-i", stuck)
    assert [r["offset"] for r in read_rows(w.table).to_pylist()] == list(range(50))
    assert append(w, 50, 10) == 10
