"""Load-manager benchmarks (issue 6): assignment of many topics, convergence after adding brokers.

usage: python bench/load_manager_bench.py [--topics 10000] [--brokers 5] [--converge-topics 60] [--json]

* assignment: `--brokers` cluster brokers (Fair), `--topics` new non-reliable topics created at once
  (metadata + unassigned markers, 21 topics per transaction); time until the leader assigned all, then until
  every owner loaded them; final CV of the topic counts.
* convergence: 3 brokers with aggressive test-sized rebalancing (check every 1 s, cooldown 1 s), topics
  created on them, then 2 brokers added; time until every broker has topics and the CV of the counts is at
  or under 0.20 (where aggressive rebalancing stops) with no move in flight, and the number of moves.

Starts its own etcd; not a test. Results go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from cluster_bench import Broker, connect, start_etcd, until
from ister.core.cluster.ownership import OwnerRecord
from ister.metadata import keys
from ister.metadata.etcd import EtcdStore
from ister.metadata.store import MAX_TXN_OPS, Op, Put


def cv(counts: list[int]) -> float:
    mean = statistics.fmean(counts)
    return statistics.pstdev(counts) / mean if mean else 0.0


async def create(store: EtcdStore, topics: list[str], delivery: str) -> None:
    """Topic metadata and unassigned markers, 21 topics (63 puts) per transaction, 16 in flight: what a
    burst of creations looks like to the leader, without the bench's own writes being the bottleneck."""
    slots = asyncio.Semaphore(16)
    per_txn = MAX_TXN_OPS // 3

    async def batch(chunk: list[str]) -> None:
        ops: list[Op] = []
        for t in chunk:
            ops += [Put(keys.topic_delivery(t), delivery), Put(keys.namespace_topic(t), None)]
            ops.append(Put(keys.unassigned(t), None))
        async with slots:
            await store.txn([], ops)

    await asyncio.gather(*(batch(topics[i : i + per_txn]) for i in range(0, len(topics), per_txn)))


async def assignments(store: EtcdStore) -> dict[str, int]:
    found: dict[str, int] = {}
    start_after = None
    while True:
        page = await store.list(keys.BROKERS_PREFIX, limit=10_000, start_after=start_after)
        found.update(keys.assignments(kv.key for kv in page))
        if len(page) < 10_000:
            return found
        start_after = page[-1].key


async def assign_many(
    store: EtcdStore, count: int, brokers: list[Broker], wait_loaded: bool
) -> dict[str, Any]:
    topics = [f"/default/many{i}" for i in range(count)]
    start = time.monotonic()
    await create(store, topics, "NonReliable")
    created = time.monotonic() - start

    async def all_assigned() -> dict[str, int] | None:
        found = await assignments(store)
        return found if all(t in found for t in topics) else None

    owners = await until(all_assigned, "every topic assigned", 900)
    assigned = time.monotonic() - start

    async def all_loaded() -> bool:
        n, start_after = 0, None
        while True:
            page = await store.list(keys.OWNERS_PREFIX, limit=10_000, start_after=start_after)
            for kv in page:
                rec = OwnerRecord.parse(kv.value)
                n += rec is not None and rec.loaded_epoch == rec.epoch
            if len(page) < 10_000:
                return n >= count
            start_after = page[-1].key

    loaded = None
    if wait_loaded:
        await until(all_loaded, "every topic loaded by its owner", 1800)
        loaded = round(time.monotonic() - start, 2)
    counts = Counter(owners[t] for t in topics)
    per = [counts.get(b.broker_id, 0) for b in brokers]
    return {
        "topics": count,
        "brokers": len(brokers),
        "create_s": round(created, 2),
        "assigned_s": round(assigned, 2),
        "assigned_per_s": round(count / assigned),
        "loaded_s": loaded,
        "spread": sorted(per),
        "cv": round(cv(per), 4),
    }


async def converge(store: EtcdStore, brokers: list[Broker], count: int) -> dict[str, Any]:
    topics = [f"/default/conv{i}" for i in range(count)]
    for b in brokers[:3]:
        b.start()
    await until(lambda: registered(store, 3), "three brokers registered", 60)
    await create(store, topics, "NonReliable")

    async def placed() -> dict[str, int] | None:
        found = await assignments(store)
        return found if all(t in found for t in topics) else None

    await until(placed, "every topic placed", 300)
    before = len(await store.list(keys.REBALANCING_HISTORY_PREFIX))
    start = time.monotonic()
    for b in brokers[3:]:
        b.start()

    async def even() -> list[int] | None:
        # Converged: every topic placed, nothing moving, every broker used, CV at or under the aggressive
        # threshold (0.20) at which rebalancing stops.
        found = await assignments(store)
        counts = Counter(found.get(t) for t in topics)
        per = [counts.get(b.broker_id, 0) for b in brokers]
        moving = await store.list(keys.UNASSIGNED_PREFIX)
        done = all(t in found for t in topics) and not moving and min(per) > 0 and cv(per) <= 0.20
        return per if done else None

    per = await until(even, "an even spread", 900)
    elapsed = time.monotonic() - start
    moves = len(await store.list(keys.REBALANCING_HISTORY_PREFIX)) - before
    return {
        "topics": count,
        "seconds": round(elapsed, 1),
        "moves": moves,
        "spread": sorted(per),
        "cv": round(cv(per), 4),
    }


async def registered(store: EtcdStore, n: int) -> bool:
    return len(await store.list(keys.REGISTER_PREFIX)) == n


async def run_phase(
    root: Path, count: int, phase: str, n_brokers: int, config: dict[str, Any], wait_loaded: bool
) -> Any:
    etcd, cport = await asyncio.to_thread(start_etcd, root, 4 << 30)
    brokers: list[Broker] = []
    store = None
    try:
        store = await until(lambda: connect(f"127.0.0.1:{cport}"), "etcd answering", 20)
        cfg = root / "ister.yml"
        cfg.write_text(yaml.safe_dump(config))
        brokers = [Broker(root, i, f"127.0.0.1:{cport}", 5) for i in range(n_brokers)]
        for b in brokers:
            b.args += ["--config-file", str(cfg)]
        if phase == "assign":
            for b in brokers:
                b.start()
            await until(lambda: registered(store, n_brokers), "every broker registered", 60)
            return await assign_many(store, count, brokers, wait_loaded)
        return await converge(store, brokers, count)
    finally:
        for b in brokers:
            b.kill()
        if store is not None:
            await store.close()
        etcd.kill()
        etcd.wait()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--topics", type=int, default=10_000)
    ap.add_argument("--brokers", type=int, default=5)
    ap.add_argument("--converge-topics", type=int, default=60)
    ap.add_argument("--wait-loaded", action="store_true", help="also time until every owner loaded")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    result: dict[str, Any] = {"loadavg": os.getloadavg()}
    base = {"load_manager": {"assignment_strategy": "fair", "load_report_interval_seconds": 1.0}}
    aggressive = {
        "load_manager": {
            "assignment_strategy": "fair",
            "load_report_interval_seconds": 1.0,
            "rebalancing": {
                "enabled": True, "aggressiveness": "aggressive", "check_interval_seconds": 1,
                "max_moves_per_hour": 1000, "cooldown_seconds": 1, "min_topic_age_seconds": 1,
            },
        }
    }  # fmt: skip
    for phase, count, n, cfg in (
        ("assign", args.topics, args.brokers, base),
        ("converge", args.converge_topics, 5, aggressive),
    ):
        root = Path(tempfile.mkdtemp(prefix=f"ister-lm-bench-{phase}-"))
        try:
            result[phase] = await run_phase(root, count, phase, n, cfg, args.wait_loaded)
            if not args.json:
                print(phase, result[phase], flush=True)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(result))
    else:
        a, c = result["assign"], result["converge"]
        print(
            f"assignment of {a['topics']} topics over {a['brokers']} brokers: assigned in "
            f"{a['assigned_s']} s ({a['assigned_per_s']}/s), loaded in {a['loaded_s']} s, "
            f"spread {a['spread']}, CV {a['cv']:.2%}"
        )
        print(f"convergence after adding 2 brokers to 3 ({c['topics']} topics): {c['seconds']} s, "
              f"{c['moves']} moves, spread {c['spread']}")  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main())
