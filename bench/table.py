"""Topics as Iceberg tables (issue 44): what the table costs publishers, how fresh it is, how fast it reads.

usage: python bench/table.py [--records 1000000] [--batch 1000] [--interval 1] [--rate 50000] [--json]

* publish cost: N 100-byte records published through the batch API (one producer, batches of --batch) to a
  standalone broker, first to a topic without a table, then to a topic of a namespace whose table policy is
  on (--interval), then to another without, the two without on brokers of their own; records/s of each
  and the difference. The table worker is started before (one record
  committed to another table: `worker_start_cpu_s`), so the phases' CPU per record leave its start out.
* freshness: while records are published at a paced --rate, the time from each batch's acknowledgement to
  the catalog commit of the first snapshot whose `ister.offset.end` covers it (snapshot timestamps, after
  the run); p50 / p99 / max.
* read: the whole table scanned by DuckDB (the data files pyiceberg's scan plans, count and total value
  bytes) vs the topic read through the batch API (`Client.read`) into the same Arrow columns.

Not a test; numbers depend on the machine and its load. Results go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb
from pyiceberg.catalog import load_catalog

from cluster_bench import until
from ister.client import Client
from ister.devcluster.broker import ISTER, BrokerNode
from ister.tables.shapes import BYTES_SHAPE
from ister.tables.typed import to_arrow


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def cli(broker: BrokerNode, *args: str) -> str:
    done = subprocess.run([*ISTER, *args, "--admin-addr", broker.admin_addr], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(done.stderr)
    return done.stdout


async def publish(
    url: str, topic: str, n: int, batch: int, rate: float | None = None
) -> list[tuple[float, int]]:
    """(ack time, last offset) per batch."""
    acks: list[tuple[float, int]] = []
    payload = b"x" * 100
    async with Client(url) as client:
        producer = await client.producer(topic, max_batch_messages=batch)
        start = time.monotonic()
        sent = 0
        while sent < n:
            k = min(batch, n - sent)
            await producer.send_batch([payload] * k)
            sent += k
            acks.append((time.time(), sent - 1))
            if rate:
                ahead = sent / rate - (time.monotonic() - start)
                if ahead > 0:
                    await asyncio.sleep(ahead)
    return acks


def _cpu_of(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu(pid: int | None) -> dict[str, float]:
    """CPU seconds so far of the broker and of its child processes (the table worker)."""
    assert pid is not None
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return {"broker": _cpu_of(pid), "worker": sum(_cpu_of(int(c)) for c in children)}


async def settle(pid: int | None, idle_share: float = 0.05, window: float = 1.0, limit: float = 120) -> float:
    """Wait until the broker and its worker use under `idle_share` of a core over `window` seconds (the
    previous phase's segment exports, Parquet copies and table work done), so that no phase pays for
    another's leftovers; returns the seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        before = sum(cpu(pid).values())
        await asyncio.sleep(window)
        if sum(cpu(pid).values()) - before < idle_share * window:
            break
    return round(time.monotonic() - t0, 1)


def table(broker: BrokerNode, topic: str) -> Any:
    found = json.loads(cli(broker, "table", topic, "-o", "json"))
    return load_catalog(found["catalog_name"], uri=found["catalog_uri"], **found["properties"]).load_table(
        found["table"]
    )


def committed(broker: BrokerNode, topic: str) -> int:
    try:
        snap = table(broker, topic).current_snapshot()
    except Exception:
        return -1
    return int(snap.summary["total-records"]) if snap is not None else 0


async def run(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="ister-table-bench-"))
    broker = BrokerNode(root / "data")
    broker.start()
    out: dict[str, Any] = {"records": args.records, "batch": args.batch, "interval_s": args.interval}
    try:
        cli(broker, "admin", "namespaces", "create", "lake")
        cli(
            broker,
            "admin",
            "namespaces",
            "set-table",
            "lake",
            "--format",
            "iceberg",
            "--interval",
            f"{args.interval}s",
        )
        # The table worker starts at the first commit of any table (spawn, imports of pyarrow, pyiceberg and
        # SQLAlchemy, the catalog opened): paid once per broker, so measured here, apart from the phases
        cpu0 = cpu(broker.pid)
        await publish(broker.url, "/lake/warmup", 1, 1)
        await until(lambda: committed(broker, "/lake/warmup") == 1, "the warm-up record committed", 600)
        out["worker_start_cpu_s"] = round(cpu(broker.pid)["worker"] - cpu0["worker"], 2)
        # off (a broker of its own, before), on (then its table catches up), off again (a broker of its own,
        # after the freshness and read parts): the mean of the runs without a table is the baseline (order
        # effects). A broker per phase: a phase's segment exports and Parquet copies, paced to spare the
        # publishes, go on for seconds after its last ack and would land in the next phase's CPU and time.
        out.update(await plain_phase(root / "off", "off", args))
        for name, topic in (("on", "/lake/t"),):
            out[f"settled_before_{name}_s"] = await settle(broker.pid)
            cpu0, t0 = cpu(broker.pid), time.monotonic()
            await publish(broker.url, topic, args.records, args.batch)
            out[f"publish_{name}_rps"] = round(args.records / (time.monotonic() - t0))
            if name == "on":  # CPU while publishing (the catch-up below adds the polls' admin calls)
                cpu_pub = cpu(broker.pid)
                out["cpu_us_per_record_on_publishing"] = {
                    k: round((cpu_pub[k] - cpu0[k]) / args.records * 1e6, 2) for k in cpu_pub
                }
                await until(
                    lambda: committed(broker, "/lake/t") == args.records, "the backlog committed", 600
                )
                out["backlog_committed_after_s"] = round(
                    time.monotonic() - t0 - args.records / out["publish_on_rps"], 1
                )
            cpu1 = cpu(broker.pid)
            out[f"cpu_us_per_record_{name}"] = {
                k: round((cpu1[k] - cpu0[k]) / args.records * 1e6, 2) for k in cpu1
            }
        print(out, file=sys.stderr, flush=True)

        n = min(args.records, int(args.rate * args.paced_seconds))
        acks = await publish(broker.url, "/lake/f", n, args.batch // 10 or 1, args.rate)
        await until(lambda: committed(broker, "/lake/f") == n, "the paced records committed", 600)
        snaps = sorted(
            (s.timestamp_ms / 1000, int(s.summary.additional_properties["ister.offset.end"]))
            for s in table(broker, "/lake/f").snapshots()
            if s.summary.additional_properties.get("ister.op") == "append"
        )
        fresh = [next(ts for ts, end in snaps if end > last) - acked for acked, last in acks]
        out["freshness_s"] = {
            "batches": len(fresh),
            "p50": round(statistics.median(fresh), 2),
            "p99": round(percentile(fresh, 0.99), 2),
            "max": round(max(fresh), 2),
        }

        print(out, file=sys.stderr, flush=True)
        tbl = table(broker, "/lake/t")
        paths = [t.file.file_path.removeprefix("file://") for t in tbl.scan().plan_files()]
        t0 = time.monotonic()
        rows, _size = (
            duckdb.connect()
            .sql(f"select count(*), sum(octet_length(value)) from read_parquet({paths!r})")
            .fetchall()[0]
        )
        out["duckdb_scan_s"] = round(time.monotonic() - t0, 3)
        assert rows == args.records, rows
        t0 = time.monotonic()
        async with Client(broker.url) as client:
            got = 0
            async for batch in client.read("/lake/t", 0, args.records):
                got += to_arrow(BYTES_SHAPE, batch).num_rows
        out["topic_read_s"] = round(time.monotonic() - t0, 3)
        assert got == args.records
        out["data_files"] = len(paths)
        broker.terminate()
        out.update(await plain_phase(root / "off2", "off2", args))
        baseline = (out["publish_off_rps"] + out["publish_off2_rps"]) / 2
        out["publish_cost_pct"] = round(100 * (1 - out["publish_on_rps"] / baseline), 1)
    finally:
        if broker.proc is not None:
            broker.terminate()
        shutil.rmtree(root, ignore_errors=True)
    return out


async def plain_phase(root: Path, name: str, args: argparse.Namespace) -> dict[str, Any]:
    """A phase without a table on a broker of its own: records/s and CPU per record while publishing."""
    broker = BrokerNode(root)
    broker.start()
    try:
        cli(broker, "admin", "namespaces", "create", "plain")
        cpu0, t0 = cpu(broker.pid), time.monotonic()
        await publish(broker.url, "/plain/t", args.records, args.batch)
        rps = round(args.records / (time.monotonic() - t0))
        cpu1 = cpu(broker.pid)
        per_record = {k: round((cpu1[k] - cpu0[k]) / args.records * 1e6, 2) for k in cpu1}
        return {
            f"publish_{name}_rps": rps,
            f"cpu_us_per_record_{name}": per_record,
        }
    finally:
        broker.terminate()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=1_000)
    p.add_argument("--interval", type=int, default=1)
    p.add_argument("--rate", type=float, default=20_000.0)
    p.add_argument("--paced-seconds", type=float, default=20.0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    result = asyncio.run(run(args))
    print(json.dumps(result, indent=None if args.json else 2))


if __name__ == "__main__":
    sys.exit(main())
