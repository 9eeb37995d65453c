"""The table writer's fixed cost per pass as a table keeps more snapshots (issue 44; docs/benchmarks.md,
"Topics as Iceberg tables"): a quiet topic's table committed every 10 s keeps 360 snapshots in the default
hour, and every pass pays for them (pyiceberg copies and parses the metadata that lists them all).

usage: python bench/table_passes.py [--passes 400] [--rows 10] [--json]

Each pass is what the committer asks of the worker for a small append: the state, an append of --rows
records, the file list; the mean CPU of each hundred passes is printed. Not a test.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from ister.core.record import StoredMessage, encode_message
from ister.tables.catalog import CatalogSpec, open_catalog
from ister.tables.committer import TableWriter
from ister.tables.shapes import BYTES_SHAPE
from ister.tables.typed import to_arrow


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--passes", type=int, default=400)
    p.add_argument("--rows", type=int, default=10)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ister-table-passes-"))
    spec = CatalogSpec(f"sqlite:///{root / 'cat.db'}", (root / "wh").as_uri())
    writer = TableWriter(open_catalog(spec), ("bench", "passes"), BYTES_SHAPE, "day")
    t0 = int(time.time() * 1000)
    means: dict[int, float] = {}
    spent: list[float] = []
    try:
        for i in range(args.passes):
            first = i * args.rows
            stored = [
                (o, encode_message(StoredMessage(b"x" * 100, t0 + o, 7, "bench-p1", {})))
                for o in range(first, first + args.rows)
            ]
            rows = to_arrow(BYTES_SHAPE, stored)
            c0 = time.process_time()
            writer.state()
            writer.append(rows, first, first + args.rows, 1)
            writer.files()
            spent.append(time.process_time() - c0)
            if (i + 1) % 100 == 0:
                means[i + 1] = round(sum(spent[-100:]) / 100 * 1e3, 1)
                if not args.json:
                    print(
                        f"snapshots {i + 1:5}: {means[i + 1]:7.1f} ms of CPU per pass (last 100)", flush=True
                    )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps({"rows": args.rows, "ms_per_pass_by_snapshots": means}))


if __name__ == "__main__":
    sys.exit(main())
