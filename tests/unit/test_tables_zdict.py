"""The table worker (another process) decodes records compressed with a zstd dictionary: the keeper sends it
the dictionaries it does not hold yet with an operation (broker/tables.py, docs/compression.md)."""

from __future__ import annotations

from pathlib import Path

from ister.benchmark.payloads import log_lines
from ister.broker.tables import TableKeeper
from ister.config import TablesSettings
from ister.core import zdict
from ister.core.compression import wrap_with_dictionary
from ister.core.record import StoredMessage, encode_message
from ister.tables.catalog import CatalogSpec, open_catalog
from ister.tables.committer import read_rows
from ister.tables.policy import TablePolicy

T0_MS = 1_767_000_000_000


async def test_the_worker_process_gets_the_dictionaries_it_needs(tmp_path: Path) -> None:
    lines = log_lines(300)
    dict_id = zdict.REGISTRY.add(
        zdict.train([encode_message(StoredMessage(p, T0_MS, 7, "p")) for p in lines], 555_001)
    )
    records = [
        (o, wrap_with_dictionary(dict_id, encode_message(StoredMessage(p, T0_MS + o, 7, "p"))))
        for o, p in enumerate(lines[:50])
    ]
    spec = CatalogSpec(f"sqlite:///{tmp_path / 'cat.db'}", (tmp_path / "wh").as_uri())
    keeper = TableKeeper(None, None, list, lambda: spec, TablesSettings())  # type: ignore[arg-type]
    partition = TablePolicy(format="iceberg").partition
    try:
        assert keeper.settings.worker_process
        await keeper.run(
            spec, ("lake", "zd"), None, partition, True, "append_records", records[:25], 0, 25, 1
        )
        assert dict_id in keeper._pool_dicts  # sent once with the first operation, not again
        await keeper.run(
            spec, ("lake", "zd"), None, partition, False, "append_records", records[25:], 25, 50, 1
        )
        rows = read_rows(open_catalog(spec).load_table(("lake", "zd"))).to_pylist()
        assert [r["value"] for r in rows] == lines[:50]
    finally:
        await keeper.close()
