"""Cluster benchmarks: failover time after kill -9 and assignment throughput (issue 4).

usage: python bench/cluster_bench.py [--trials 10] [--topics 1000] [--lease-ttl 5] [--json]

Starts its own etcd (the `etcd` binary, as `make test` installs it) and 3 `ister broker --mode cluster`
processes on free loopback ports, then:

* failover: per trial, a reliable topic owned by a non-leader broker takes a message; that broker is killed
  with SIGKILL; the clock runs until a producer (Ister client through a surviving broker) gets a message
  accepted on the topic again; the killed broker is restarted before the next trial. p50/p99/max.
* assignment: N topics are created at once by writing their metadata and unassigned markers (64 writes in
  flight, like many producers arriving together); the clock runs until the leader has assigned all of them,
  then until every owner has loaded (claimed) them. Topics/s and the spread over the brokers.

Not a test: numbers depend on the machine and its load. Results go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root, for tests.support

from tests import support

from ister.client import Client
from ister.core.cluster.ownership import OwnerRecord
from ister.devcluster.ports import free_port, wait_port
from ister.errors import MetadataError
from ister.metadata import keys
from ister.metadata.etcd import EtcdStore


def start_etcd(root: Path, quota_bytes: int | None = None) -> tuple[subprocess.Popen[bytes], int]:
    """A single-member etcd on free loopback ports with its data under `root`; (process, client port)."""
    etcd_bin = shutil.which("etcd")
    if etcd_bin is None:
        sys.exit("etcd is not installed (make test installs etcd-server)")
    cport, pport = free_port(), free_port()
    quota = ["--quota-backend-bytes", str(quota_bytes)] if quota_bytes else []
    log = open(root / "etcd.log", "wb")  # noqa: SIM115 - the child owns it
    proc = subprocess.Popen(
        [
            etcd_bin, "--name", "bench", "--data-dir", str(root / "etcd"), *quota,
            "--listen-client-urls", f"http://127.0.0.1:{cport}", "--advertise-client-urls", f"http://127.0.0.1:{cport}",
            "--listen-peer-urls", f"http://127.0.0.1:{pport}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{pport}",
            "--initial-cluster", f"bench=http://127.0.0.1:{pport}", "--initial-cluster-state", "new",
        ],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    wait_port(cport, proc, 30.0, "etcd")
    return proc, cport


class Broker:
    def __init__(self, root: Path, index: int, etcd: str, ttl: int) -> None:
        self.dir = root / f"b{index}"
        self.port = free_port()
        self.args = [
            sys.executable, "-m", "ister.cli", "broker", "--mode", "cluster",
            "--etcd-endpoints", etcd, "--cluster-name", "bench", "--data-dir", str(self.dir),
            "--broker-addr", f"127.0.0.1:{self.port}", "--admin-addr", f"127.0.0.1:{free_port()}",
            "--prom-exporter", f"127.0.0.1:{free_port()}", "--log-level", "warning",
        ]  # fmt: skip
        self.env = {**os.environ, "ISTER_CLUSTER__LEASE_TTL_SECONDS": str(ttl)}
        self.log = root / f"b{index}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def broker_id(self) -> int:
        return int((self.dir / "broker_id").read_text())

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        wait_port(self.port, self.proc, 30.0, "broker")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
            self.proc = None


async def until(check: Any, what: str, seconds: float = 60.0) -> Any:
    """The tests' `until` polling every 10 ms: the times this benchmark reports are measured with it."""
    return await support.until(check, what, seconds, poll=0.01)


async def connect(endpoint: str) -> EtcdStore | None:
    try:
        return await EtcdStore.connect([endpoint])
    except MetadataError:
        return None


async def produce_once(url: str, topic: str, seconds: float = 60.0) -> float:
    """Seconds until a message is accepted on `topic` through `url`, retrying with fresh clients."""
    start = time.monotonic()
    while True:
        client = Client(url, max_retries=0, connect_timeout=2.0)
        try:
            async with asyncio.timeout(3.0):
                producer = await client.producer(topic, reliable=True, linger_ms=0)
                await producer.send(b"x" * 100)
            return time.monotonic() - start
        except Exception:
            if time.monotonic() - start > seconds:
                raise
            await asyncio.sleep(0.01)
        finally:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await client.close()


async def failover(brokers: list[Broker], store: EtcdStore, trials: int) -> dict[str, Any]:
    times: list[float] = []
    for trial in range(trials):
        live = {b.broker_id for b in brokers}

        async def all_live(live: set[int] = live) -> bool:
            found = keys.broker_ids(kv.key for kv in await store.list(keys.REGISTER_PREFIX))
            return set(found) == live

        await until(all_live, "every broker registered")
        leader = (await until(lambda: store.get(keys.LEADER), "a leader")).value
        # Create topics until one lands on a non-leader (round-robin makes that the first or second).
        for n in range(10):
            topic = f"/default/fo{trial}x{n}"
            await produce_once(brokers[0].url, topic)
            owner = keys.assignments(kv.key for kv in await store.list(keys.BROKERS_PREFIX)).get(topic)
            if owner is not None and owner != leader:
                break
        victim = next(b for b in brokers if b.broker_id == owner)
        survivor = next(b for b in brokers if b is not victim)
        victim.kill()
        elapsed = await produce_once(survivor.url, topic)
        times.append(elapsed)
        print(f"cluster_bench: failover trial {trial}: {elapsed:.2f} s", file=sys.stderr, flush=True)
        victim.start()
    times.sort()
    return {
        "trials": trials,
        "p50_s": statistics.median(times),
        "p99_s": times[min(len(times) - 1, round(0.99 * (len(times) - 1)))],
        "max_s": times[-1],
        "all_s": [round(t, 3) for t in times],
    }


async def assignment(store: EtcdStore, count: int, broker_ids: list[int]) -> dict[str, Any]:
    topics = [f"/default/as{i}" for i in range(count)]
    slots = asyncio.Semaphore(64)

    async def create(t: str) -> None:
        async with slots:
            await store.put(keys.topic_delivery(t), "Reliable")
            await store.put(keys.namespace_topic(t), None)
            await store.put(keys.unassigned(t), None)

    start = time.monotonic()
    await asyncio.gather(*(create(t) for t in topics))
    created = time.monotonic() - start

    async def assigned() -> dict[str, int] | None:
        found = keys.assignments(kv.key for kv in await store.list(keys.BROKERS_PREFIX))
        return found if all(t in found for t in topics) else None

    owners = await until(assigned, "every topic assigned", 300)
    assign_s = time.monotonic() - start

    async def loaded() -> bool:
        n = 0
        for kv in await store.list(keys.OWNERS_PREFIX):
            rec = OwnerRecord.parse(kv.value)
            n += rec is not None and kv.key.split("/")[-1].startswith("as") and rec.loaded_epoch == rec.epoch
        return n >= count

    await until(loaded, "every topic loaded by its owner", 300)
    load_s = time.monotonic() - start
    spread = Counter(owners[t] for t in topics)
    return {
        "topics": count,
        "create_s": round(created, 3),
        "assigned_s": round(assign_s, 3),
        "assigned_per_s": round(count / assign_s, 1),
        "loaded_s": round(load_s, 3),
        "loaded_per_s": round(count / load_s, 1),
        "spread": sorted(spread.get(b, 0) for b in broker_ids),
    }


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--topics", type=int, default=1000)
    ap.add_argument("--lease-ttl", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ister-cluster-bench-"))
    etcd, cport = start_etcd(root)
    brokers: list[Broker] = []
    store = None
    try:
        store = await until(lambda: connect(f"127.0.0.1:{cport}"), "etcd answering", 20)
        brokers = [Broker(root, i, f"127.0.0.1:{cport}", args.lease_ttl) for i in range(3)]
        for b in brokers:
            b.start()
        result: dict[str, Any] = {"lease_ttl_s": args.lease_ttl, "loadavg": os.getloadavg()}
        result["failover"] = await failover(brokers, store, args.trials)
        result["assignment"] = await assignment(store, args.topics, [b.broker_id for b in brokers])
    finally:
        for b in brokers:
            b.kill()
        if store is not None:
            await store.close()
        etcd.kill()
        etcd.wait()
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(result))
    else:
        f, a = result["failover"], result["assignment"]
        print(f"failover after kill -9 (lease TTL {args.lease_ttl} s, {f['trials']} trials): "
              f"p50 {f['p50_s']:.2f} s, p99 {f['p99_s']:.2f} s, max {f['max_s']:.2f} s")  # fmt: skip
        print(f"assignment of {a['topics']} topics over 3 brokers: all assigned in {a['assigned_s']} s "
              f"({a['assigned_per_s']} topics/s), all loaded in {a['loaded_s']} s ({a['loaded_per_s']}/s), "
              f"spread {a['spread']}")  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main())
