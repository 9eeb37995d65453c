"""The table worker reads the records it commits from their WAL segment file (storage/wal/runs.py), and the
broker reads and sends them itself when it cannot (the file deleted by retention meanwhile): a committer on
a real WAL, a real SQLite catalog and the real worker process."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ister.broker import tables
from ister.broker.tables import TableKeeper, TopicCommitter
from ister.config import TablesSettings
from ister.core.compression import Codec, wrap
from ister.core.record import StoredMessage, encode_message
from ister.ids import TopicName
from ister.storage.wal import Wal, WalConfig
from ister.tables.catalog import CatalogSpec, open_catalog
from ister.tables.committer import read_rows
from ister.tables.policy import TablePolicy
from ister.tables.shapes import BYTES_SHAPE
from ister.tables.typed import run_to_arrow, to_arrow

T0_MS = 1_767_000_000_000
N = 3_000
COMPRESSED = {5, 1_700}  # stored zstd-compressed: the worker decompresses them


def stored(o: int) -> bytes:
    plain = encode_message(
        StoredMessage(f"v{o}".encode(), T0_MS + o, 7, "prod", {"n": str(o)} if o % 2 else {}, f"k{o}")
    )
    return wrap(Codec.ZSTD, plain) if o in COMPRESSED else plain


class Storage:
    """What the committer asks of the topic's storage: the earliest offset and a reader (the WAL's)."""

    async def earliest(self, name: TopicName, wal: Wal) -> int:
        return wal.first_offset

    def reader(self, name: TopicName, wal: Wal, start: int) -> Any:
        return wal.reader(start)


async def test_worker_reads_the_wal_files_and_the_broker_takes_over_when_one_is_gone(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path / "wal", WalConfig(segment_max_bytes=32 * 1024))
    spec = CatalogSpec(f"sqlite:///{tmp_path / 'cat.db'}", (tmp_path / "wh").as_uri())
    keeper = TableKeeper(
        None,  # type: ignore[arg-type]  # the policy cache: not used by a committer made here
        Storage(),  # type: ignore[arg-type]
        list,
        lambda: spec,
        TablesSettings(max_commit_records=1_000, worker_nice=5),
    )
    topic = SimpleNamespace(
        name=TopicName.parse("/lake/events"),
        wal=wal,
        claim=SimpleNamespace(epoch=1),
        start_offset=0,
        exporter=None,
    )
    committer = TopicCommitter(keeper, topic, TablePolicy(format="iceberg"))  # type: ignore[arg-type]
    calls: list[str] = []
    real_run = keeper.run

    async def run(*args: Any) -> Any:
        op = args[5]
        if op == "append_wal" and args[6].first == 0:
            os.unlink(args[6].path)  # retention deleted the file after the broker located the run
        calls.append(op)
        return await real_run(*args)

    keeper.run = run  # type: ignore[method-assign]
    try:
        for i in range(0, N, 250):
            await wal.append([stored(o) for o in range(i, i + 250)])
        segments = wal.segments()
        assert len(segments) >= 3
        fallbacks = tables.table_fallbacks._value.get()
        assert await committer.run_once() == N
        appends = [c for c in calls if c.startswith("append")]
        # the first run's file is gone: the broker reads it (from the WAL's cache here) and sends it
        assert appends[:2] == ["append_wal", "append_packed"]
        assert "append_packed" not in appends[2:] and len(appends) > 3
        assert tables.table_fallbacks._value.get() == fallbacks + 1
        pool = keeper._pool
        assert pool is not None  # the worker process runs at `tables.worker_nice` above the broker
        (pid,) = pool._processes
        assert os.getpriority(os.PRIO_PROCESS, pid) == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 5)
        rows = read_rows(open_catalog(spec).load_table(("lake", "events"))).to_pylist()
        assert [r["offset"] for r in rows] == list(range(N))
        assert [r["value"] for r in rows] == [f"v{o}".encode() for o in range(N)]
        assert rows[1_700]["key"] == b"k1700" and rows[5]["attributes"] == [("n", "5")]
        assert rows[6]["attributes"] == []
        # nothing new: no append at all
        calls.clear()
        assert await committer.run_once() == 0
        assert not [c for c in calls if c.startswith("append")]
    finally:
        await keeper.close()
        await wal.close()


def test_rows_of_a_run_equal_the_rows_of_its_records() -> None:
    """`run_to_arrow` (bulk decode, attributes built flat) gives `to_arrow`'s rows: records with and
    without attributes, compressed ones, none with attributes, all with them."""
    for first, count in ((0, 40), (7, 1), (4, 1)):
        runs = [stored(o) for o in range(first, first + count)]
        expected = to_arrow(BYTES_SHAPE, [(first + i, r) for i, r in enumerate(runs)])
        assert run_to_arrow(BYTES_SHAPE, first, runs).equals(expected)
    assert run_to_arrow(BYTES_SHAPE, 0, []).num_rows == 0
