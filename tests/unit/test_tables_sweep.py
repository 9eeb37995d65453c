"""TableWriter's orphan sweep, table locations and topic incarnations on a real pyiceberg SQL catalog
(SQLite + a local warehouse): a stray Parquet file no snapshot names is deleted once old enough, a young
one and every named one stay, a deletion that fails (an immutable file: EPERM even for root) is reported
and changes nothing; a table of an earlier topic of the same name is refused, then renamed out of the way."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from ister.errors import FailedPrecondition
from ister.tables.catalog import CatalogSpec, open_catalog
from ister.tables.committer import TOPIC, TableWriter, read_rows
from ister.tables.shapes import BYTES_SHAPE
from ister.tables.sweep import SweepResult, data_dir
from ister.tables.typed import to_arrow
from tests.unit.test_tables_committer import records

HOUR = 3600.0


def writer(tmp_path: Path, table: str = "events") -> TableWriter:
    spec = CatalogSpec(f"sqlite:///{tmp_path / 'cat.db'}", (tmp_path / "wh").as_uri())
    return TableWriter(open_catalog(spec), ("default", table), BYTES_SHAPE, "day")


def append(w: TableWriter, first: int, count: int, topic: int = 0) -> int:
    return w.append(to_arrow(BYTES_SHAPE, records(first, count)), first, first + count, 1, topic)


def stray(w: TableWriter, name: str, age: float) -> Path:
    """A Parquet file in the table's data directory that no snapshot names, `age` seconds old."""
    named = Path(next(iter(w._all_files())).removeprefix("file://"))
    path = Path(data_dir(w.table).removeprefix("file://")) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(named, path)
    then = time.time() - age
    os.utime(path, (then, then))
    return path


def test_sweep_deletes_old_orphans_only(tmp_path: Path) -> None:
    w = writer(tmp_path)
    append(w, 0, 50)
    append(w, 50, 50)
    named = {Path(p.removeprefix("file://")) for p in w._all_files()}
    for p in named:  # named files older than any minimum age stay
        os.utime(p, (time.time() - 9 * HOUR,) * 2)
    old = stray(w, "00000-9-orphan.parquet", 2 * HOUR)
    deep = stray(w, "publish_day=2020-01-01/00000-9-deep.parquet", 2 * HOUR)
    young = stray(w, "00000-9-young.parquet", 60)
    other = stray(w, "notes.txt", 2 * HOUR)  # not Parquet: not the writer's
    result = w.sweep(HOUR)
    assert isinstance(result, SweepResult) and result.error is None
    assert sorted(result.deleted) == sorted(f"file://{p}" for p in (old, deep))
    assert not old.exists() and not deep.exists() and young.exists() and other.exists()
    assert all(p.exists() for p in named)
    assert read_rows(w.table).column("offset").to_pylist() == list(range(100))
    assert w.sweep(HOUR).deleted == []  # nothing more
    assert w.sweep(30, now=time.time() + 60).deleted == [f"file://{young}"]  # once it is old enough


def test_files_of_expired_snapshots_are_orphans_and_kept_ones_are_not(tmp_path: Path) -> None:
    w = writer(tmp_path)
    append(w, 0, 10)
    append(w, 10, 10)
    w.compact(0, 19, 1)  # the two files are replaced; the older snapshots still name them
    before = w._all_files()
    assert len(before) == 3
    assert w.sweep(0, now=time.time() + 10 * HOUR).deleted == []  # every file is named by a kept snapshot
    assert read_rows(w.table).num_rows == 20


@pytest.mark.skipif(shutil.which("chattr") is None, reason="needs chattr")
def test_a_deletion_that_fails_is_reported_and_changes_nothing(tmp_path: Path) -> None:
    w = writer(tmp_path)
    append(w, 0, 10)
    stuck = stray(w, "00000-9-stuck.parquet", 2 * HOUR)
    if subprocess.run(["chattr", "+i", str(stuck)], check=False).returncode != 0:
        pytest.skip("the filesystem has no immutable attribute")
    try:
        result = w.sweep(HOUR)
        assert result.deleted == [] and result.error is not None and "could not delete" in result.error
        assert stuck.exists()
        assert read_rows(w.table).num_rows == 10
    finally:
        subprocess.run(["chattr", "-i", str(stuck)], check=True)
    assert w.sweep(HOUR).deleted == [f"file://{stuck}"]


def test_each_table_gets_a_location_of_its_own(tmp_path: Path) -> None:
    w = writer(tmp_path)
    first = w.table.location()
    assert first.startswith((tmp_path / "wh").as_uri() + "/default/events-")
    assert writer(tmp_path).table.location() == first  # opened again: the same table
    w.retire("events-deleted-5")
    again = writer(tmp_path)
    assert again.table.location() != first


def test_a_table_of_an_earlier_topic_is_refused_then_renamed(tmp_path: Path) -> None:
    w = writer(tmp_path)
    assert append(w, 0, 30, topic=7) == 30
    assert w.state().topic == 7
    assert w.table.current_snapshot().summary.additional_properties[TOPIC] == "7"
    with pytest.raises(FailedPrecondition, match="earlier topic"):
        append(w, 0, 5, topic=9)  # the topic was deleted and created again: offsets restart at 0
    assert append(w, 30, 5) == 5  # revision unknown: no check, and the stamp is carried on
    assert w.state().topic == 7
    w.stamp(9)  # the broker's pass gives the writer the topic's revision before appending
    with pytest.raises(FailedPrecondition, match="earlier topic"):
        append(w, 35, 5)
    w.stamp(7)
    assert append(w, 35, 5) == 5 and w.state().topic == 7
    w.retire("events-deleted-7")
    old = w.catalog.load_table(("default", "events-deleted-7"))
    assert read_rows(old).num_rows == 40  # kept, rows and files
    fresh = writer(tmp_path)
    assert fresh.state().end == 0
    assert append(fresh, 0, 5, topic=9) == 5
    assert read_rows(fresh.table).column("offset").to_pylist() == list(range(5))
    assert read_rows(old).num_rows == 40
    # the new table's sweep never sees the old table's files: they live at the old table's location
    assert fresh.sweep(0, now=time.time() + 10 * HOUR).deleted == []
    assert read_rows(w.catalog.load_table(("default", "events-deleted-7"))).num_rows == 40


def test_a_rename_that_fails_changes_nothing(tmp_path: Path) -> None:
    from pyiceberg.exceptions import TableAlreadyExistsError

    w = writer(tmp_path)
    append(w, 0, 10, topic=3)
    writer(tmp_path, "events-deleted-3")  # the name is taken
    with pytest.raises(TableAlreadyExistsError):
        w.retire("events-deleted-3")
    again = writer(tmp_path)
    assert again.state().topic == 3 and read_rows(again.table).num_rows == 10


def test_every_snapshot_is_read_only_when_an_old_file_is_not_the_current_snapshots(tmp_path: Path) -> None:
    from ister.tables.sweep import sweep

    w = writer(tmp_path)
    append(w, 0, 10)
    append(w, 10, 10)

    def every_snapshot() -> set[str]:
        raise AssertionError("read every snapshot's manifests")

    assert sweep(w.table, every_snapshot, HOUR, now=time.time() + 10 * HOUR).deleted == []
    stray(w, "00000-9-orphan.parquet", 2 * HOUR)
    assert len(sweep(w.table, w._all_files, HOUR).deleted) == 1
