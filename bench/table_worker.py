"""The table worker's CPU per record, in one process (issue 44; docs/benchmarks.md, "Topics as Iceberg
tables"): a real WAL filled like a publisher would, then a real committer's passes with every worker
operation run inline (no process, no thread), so `time.process_time` and cProfile see all of it.

usage: python bench/table_worker.py [--records 1000000] [--per-pass 150000] [--payload random|same]
                                    [--profile prof.out] [--json]

Each round appends `--per-pass` records of 100 bytes to the WAL (batches of 1,000, segments of 64 MiB) and
runs one committer pass (what a broker does every interval while publishes come at per-pass/interval
records/s). The figure is the passes' CPU over the records: rows, frame split, Parquet writes, catalog
commits, the per-pass reads, compaction of closed segments, retention checks. Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ister.broker.tables import TableKeeper, TopicCommitter, _dispatch
from ister.config import TablesSettings
from ister.core.record import StoredMessage, encode_message
from ister.ids import TopicName
from ister.storage.wal import Wal, WalConfig
from ister.tables.catalog import CatalogSpec, open_catalog
from ister.tables.policy import TablePolicy


class Storage:
    """What the committer asks of the topic's storage: the earliest offset and a reader (the WAL's)."""

    async def earliest(self, name: TopicName, wal: Wal) -> int:
        return wal.first_offset

    def reader(self, name: TopicName, wal: Wal, start: int) -> Any:
        return wal.reader(start)


def payloads(kind: str, n: int, rng: random.Random) -> list[bytes]:
    if kind == "same":
        return [b"x" * 100] * n
    # JSON-ish text of 100 bytes with varying digits: what a real topic's values look like to a codec
    return [
        (b'{"id":%012d,"user":"u%06d","amount":%9.2f,"note":"' % (rng.randrange(10**12), rng.randrange(10**6),
         rng.random() * 1e6)).ljust(98, b"a") + b'"}'
        for _ in range(n)
    ]  # fmt: skip


async def run(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="ister-table-worker-bench-"))
    rng = random.Random(7)
    wal = await Wal.open(root / "wal", WalConfig(fsync="interval"))
    spec = CatalogSpec(f"sqlite:///{root / 'cat.db'}", (root / "wh").as_uri())
    keeper = TableKeeper(
        None,  # type: ignore[arg-type]  # the policy cache: not used by a committer made here
        Storage(),  # type: ignore[arg-type]
        list,
        lambda: spec,
        TablesSettings(worker_process=False),
    )

    async def inline(*a: Any) -> Any:
        return _dispatch(*a)

    keeper.run = inline  # type: ignore[method-assign]
    topic = SimpleNamespace(
        name=TopicName.parse("/lake/events"),
        wal=wal,
        claim=SimpleNamespace(epoch=1),
        start_offset=0,
        exporter=None,
    )
    committer = TopicCommitter(keeper, topic, TablePolicy(format="iceberg"))  # type: ignore[arg-type]
    # what the worker imports at its first operation (pyiceberg, SQLAlchemy): once per worker, not measured
    import pyiceberg.catalog.sql
    import pyiceberg.io.pyarrow
    import pyiceberg.table  # noqa: F401

    profile = cProfile.Profile() if args.profile else None
    cpu = 0.0
    in_gc = [0.0, 0.0]  # seconds in the cyclic garbage collector during the passes, its start

    def gc_timer(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            in_gc[1] = time.process_time()
        else:
            in_gc[0] += time.process_time() - in_gc[1]

    passes: list[float] = []
    written = 0
    t0 = time.time_ns() // 1_000_000
    try:
        while written < args.records:
            n = min(args.per_pass, args.records - written)
            values = payloads(args.payload, n, rng)
            for i in range(0, n, 1000):
                chunk = values[i : i + 1000]
                now = t0 + (written + i) // 100  # 100,000 records/s of publish times
                await wal.append([encode_message(StoredMessage(v, now, 7, "bench-p1", {})) for v in chunk])
            written += n
            c0 = time.process_time()
            gc.callbacks.append(gc_timer)
            if profile is not None:
                profile.enable()
            await committer.run_once()
            if profile is not None:
                profile.disable()
            gc.callbacks.remove(gc_timer)
            passes.append(time.process_time() - c0)
            cpu += passes[-1]
        table = open_catalog(spec).load_table(("lake", "events"))
        snap = table.current_snapshot()
        assert snap is not None and int(snap.summary["total-records"]) == args.records
        files = len(list(table.scan().plan_files()))
    finally:
        await wal.close()
        shutil.rmtree(root, ignore_errors=True)
    if profile is not None:
        profile.dump_stats(args.profile)
    return {
        "records": args.records,
        "per_pass": args.per_pass,
        "payload": args.payload,
        "cpu_us_per_record": round(cpu / args.records * 1e6, 2),
        "gc_us_per_record": round(in_gc[0] / args.records * 1e6, 2),
        "pass_cpu_s": [round(p, 3) for p in passes],
        "data_files": files,
        "load": os.getloadavg()[0],
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--per-pass", type=int, default=150_000)
    p.add_argument("--payload", choices=("random", "same"), default="random")
    p.add_argument("--profile", help="write cProfile stats of the passes here")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    result = asyncio.run(run(args))
    print(json.dumps(result, indent=None if args.json else 2))


if __name__ == "__main__":
    sys.exit(main())
