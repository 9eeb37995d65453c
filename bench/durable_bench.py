"""Durable-tier benchmarks (issue 5): move time, catch-up reads from objects, export throughput.

usage: python bench/durable_bench.py [--moves 20] [--messages 1000000] [--s3] [--no-export] [--json]
                                      [--py-spy PATH --raw OUT]

* move: 3 `ister broker --mode cluster` processes on one etcd, a shared `file://` durable tier (or
  SeaweedFS with --s3); per move, a reliable topic that just took a message is unloaded (the admin
  transaction) and the clock runs until a producer (Ister client, through the old owner) gets a message
  accepted on the new owner. p50 / p99 over all moves.
* catch-up: N 100-byte messages produced through the batch API on a 1-broker cluster whose WAL keeps
  nothing locally once exported; after the export, a new subscription from offset 0 reads them all
  back through the batch API (objects -> WAL -> live). msg/s.
* export: N 100-byte messages appended to a WAL in this process, then `SegmentExporter.export_tail`
  into the same kind of store. MB/s of WAL bytes exported.

Not a test; numbers depend on the machine and its load. Results go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from cluster_bench import Broker, connect, produce_once, start_etcd, until
from ister.client import Client
from ister.metadata import keys
from ister.metadata.etcd import EtcdStore
from ister.metadata.store import Compare, Delete, Put
from ister.storage.objects import SegmentExporter, list_descriptors, open_store
from ister.storage.wal import Wal, WalConfig

REPO = str(Path(__file__).resolve().parent.parent)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def unload(store: EtcdStore, topic: str) -> int:
    owner = keys.assignments(kv.key for kv in await store.list(keys.BROKERS_PREFIX))[topic]
    kv = await store.get(keys.broker_topic(owner, topic))
    assert kv is not None
    marker = {"reason": "unload", "from_broker": owner, "ready": False}
    ok = await store.txn(
        [Compare(kv.key, kv.version), Compare(keys.unassigned(topic), None)],
        [Delete(kv.key), Put(keys.unassigned(topic), marker)],
    )
    assert ok
    return owner


async def moves(store: EtcdStore, brokers: list[Broker], count: int) -> dict[str, Any]:
    topic = "/default/moving"
    await produce_once(brokers[0].url, topic)
    times: list[float] = []
    for i in range(count):
        assigned = keys.assignments(kv.key for kv in await store.list(keys.BROKERS_PREFIX))
        owner = assigned[topic]
        old = next(b for b in brokers if b.broker_id == owner)
        start = time.monotonic()
        await unload(store, topic)

        async def elsewhere(owner: int = owner) -> bool:
            now = keys.assignments(kv.key for kv in await store.list(keys.BROKERS_PREFIX)).get(topic)
            return now is not None and now != owner

        # Produce through the old owner: it redirects once the new owner has the topic.
        while True:
            await produce_once(old.url, topic)
            if await elsewhere():
                break
        times.append(time.monotonic() - start)
        print(f"durable_bench: move {i}: {times[-1] * 1000:.0f} ms", file=sys.stderr, flush=True)
    return {
        "moves": count,
        "p50_ms": round(statistics.median(times) * 1000, 1),
        "p99_ms": round(percentile(times, 0.99) * 1000, 1),
        "max_ms": round(max(times) * 1000, 1),
    }


async def catch_up(
    store: EtcdStore, broker: Broker, count: int, py_spy: str | None = None, raw: Path | None = None
) -> dict[str, Any]:
    topic = "/default/history"
    async with Client(broker.url) as client:
        producer = await client.producer(topic, max_batch_messages=4096)
        payload = b"x" * 100
        for start in range(0, count, 8192):
            await producer.send_batch([payload] * min(8192, count - start))
        await producer.flush()

        async def exported() -> bool:
            found = await list_descriptors(store, topic)
            return bool(found) and found[-1].end_offset >= count - 1

        t_export = time.monotonic()
        await until(exported, "the topic exported", 600)
        export_wait = time.monotonic() - t_export
        await store.put(
            keys.subscription(topic, "history"),
            {"subscription_name": "history", "subscription_type": 0, "consumer_id": None,
             "consumer_name": "h", "key_filters": [], "start_offset": 0},
        )  # fmt: skip
        consumer = await client.consumer(topic, "history", name="h", window=10_000)
        got = 0
        spy = _start_py_spy(py_spy, broker, raw) if py_spy and raw else None
        broker_cpu, own_cpu = _cpu_seconds(broker), time.process_time()
        start = time.monotonic()
        while got < count:
            batch = await consumer.receive_batch(10_000, timeout=30)
            if not batch:
                raise TimeoutError(f"catch-up stalled at {got}")
            got += len(batch)
            await consumer.ack_upto(batch[-1])
        elapsed = time.monotonic() - start
        broker_cpu, own_cpu = _cpu_seconds(broker) - broker_cpu, time.process_time() - own_cpu
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(60)
        await consumer.close()
    return {
        "messages": count,
        "seconds": round(elapsed, 2),
        "msg_per_s": round(count / elapsed),
        "broker_cpu_us_per_msg": round(broker_cpu / count * 1e6, 2),
        "client_cpu_us_per_msg": round(own_cpu / count * 1e6, 2),
        "export_wait_s": round(export_wait, 2),
    }


def _start_py_spy(py_spy: str, broker: Broker, raw: Path) -> subprocess.Popen[bytes]:
    """py-spy sampling the broker (all threads, without pausing it) until SIGINT; raw stacks to `raw`."""
    assert broker.proc is not None
    cmd = [py_spy, "record", "--threads", "--nonblocking", "-f", "raw", "-r", "250", "-o", str(raw),
           "-p", str(broker.proc.pid)]  # fmt: skip
    spy = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # py-spy attaches
    return spy


def _cpu_seconds(broker: Broker) -> float:
    """User + system CPU seconds of the broker process so far (/proc)."""
    assert broker.proc is not None
    fields = Path(f"/proc/{broker.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def export_rate(url: str, options: dict[str, str], count: int, root: Path, etcd: str) -> dict[str, Any]:
    wal_dir = root / "export-wal"
    wal = await Wal.open(wal_dir, WalConfig(segment_max_bytes=64 << 20))
    payload = b"x" * 100
    for start in range(0, count, 8192):
        await wal.append([payload] * min(8192, count - start))
    await wal.close()
    nbytes = sum(size for _, _, size in wal.segments())
    meta = await EtcdStore.connect([etcd], namespace="/export-bench")
    exporter = SegmentExporter("/default/export", wal, open_store(url, options), meta)
    start = time.monotonic()
    await exporter.export_tail()
    elapsed = time.monotonic() - start
    await meta.close()
    return {
        "messages": count,
        "bytes": nbytes,
        "seconds": round(elapsed, 2),
        "mb_per_s": round(nbytes / elapsed / 1e6, 1),
    }


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--moves", type=int, default=20, help="0: skip the move measurement")
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument(
        "--s3", action="store_true", help="SeaweedFS (weed mini) instead of a shared file:// tier"
    )
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-export", action="store_true", help="skip the export-rate measurement")
    ap.add_argument("--py-spy", help="py-spy executable: profile the broker during the catch-up")
    ap.add_argument("--raw", type=Path, help="with --py-spy: write its raw stacks here")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ister-durable-bench-"))
    etcd, cport = start_etcd(root)
    weed = None
    brokers: list[Broker] = []
    store = None
    result: dict[str, Any] = {"loadavg": os.getloadavg()}
    try:
        store = await until(lambda: connect(f"127.0.0.1:{cport}"), "etcd answering", 20)
        if args.s3:
            sys.path.insert(0, REPO)
            from tests.seaweed_server import SeaweedServer

            weed = SeaweedServer(root / "s3")
            weed.start()
            url, options = f"{weed.url}/bench", weed.options()
        else:
            url, options = (root / "objects").as_uri(), {}
        result["tier"] = "s3 (SeaweedFS weed mini)" if args.s3 else "file:// (shared directory)"
        config = root / "ister.yml"
        config.write_text(yaml.safe_dump({"storage": {"durable": {
            "url": url, "options": options, "export_interval_seconds": 1.0, "segment_max_age_seconds": 2.0,
            "local_retention_bytes": 0, "local_retention_seconds": 0}}}))  # fmt: skip
        nbrokers = 3 if args.moves else 1
        brokers = [Broker(root, i, f"127.0.0.1:{cport}", 5) for i in range(nbrokers)]
        for b in brokers:
            b.args += ["--config-file", str(config)]
            b.start()
        await until(lambda: _all_registered(store, nbrokers), "the brokers registered")
        if args.moves:
            result["move"] = await moves(store, brokers, args.moves)
        for b in brokers[1:]:
            b.kill()
        await until(lambda: _all_registered(store, 1), "one broker registered")
        result["catch_up"] = await catch_up(store, brokers[0], args.messages, args.py_spy, args.raw)
        if not args.no_export:
            result["export"] = await export_rate(url, options, args.messages, root, f"127.0.0.1:{cport}")
    finally:
        for b in brokers:
            b.kill()
        if store is not None:
            await store.close()
        if weed is not None:
            weed.stop()
        etcd.kill()
        etcd.wait()
        if os.environ.get("DURABLE_BENCH_KEEP"):
            print(f"durable_bench: kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    result["loadavg_end"] = os.getloadavg()
    if args.json:
        print(json.dumps(result))
    else:
        c = result["catch_up"]
        print(f"tier: {result['tier']}; load average {result['loadavg']} -> {result['loadavg_end']}")
        if "move" in result:
            m = result["move"]
            print(f"move (unload -> produce accepted on the new owner), {m['moves']} moves: "
                  f"p50 {m['p50_ms']} ms, p99 {m['p99_ms']} ms, max {m['max_ms']} ms")  # fmt: skip
        print(f"catch-up of {c['messages']} messages from objects via the batch API: {c['msg_per_s']} msg/s "
              f"({c['seconds']} s; export finished {c['export_wait_s']} s after produce; CPU per message: "
              f"broker {c['broker_cpu_us_per_msg']} us, client {c['client_cpu_us_per_msg']} us)")  # fmt: skip
        if "export" in result:
            e = result["export"]
            print(f"export of {e['bytes']} WAL bytes: {e['mb_per_s']} MB/s ({e['seconds']} s)")


async def _all_registered(store: EtcdStore, n: int) -> bool:
    return len(await store.list(keys.REGISTER_PREFIX)) == n


if __name__ == "__main__":
    asyncio.run(main())
