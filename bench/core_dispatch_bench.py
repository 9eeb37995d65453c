"""Micro-benchmark of the reliable dispatch state machine (core only: no I/O, no asyncio). Not a test.

usage: python bench/core_dispatch_bench.py [--messages 1000000] [--window 10000] [--types exclusive,...]
                                           [--api per-message,batch,cumulative] [--json]

For each subscription type it pushes `--messages` messages through one ReliableSubscriptionState with a
full window and measures the state machine alone (one core, wall clock):
  per-message  offer() until the window is full, poll(), on_ack() of every delivery (the Danube path)
  batch        offer_batch() of the free window, poll(), one ack_range() over each poll's delivered
               offsets (first to last; for Key-Shared the span also holds undelivered messages, ignored)
  cumulative   offer_batch(), poll(), then per consumer one ack_upto() of the highest offset it got
Consumers: Exclusive 1, Failover 2 (one standby), Shared 4, Key-Shared 4 with 1,000 random keys.
The clock advances 1 ms per round; the ack timeout (30 s) never fires.
Prints wall-clock msgs/s and us/msg, and process CPU us/msg (steadier on a shared machine).
Numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from ister.core.dispatch import (  # noqa: E402
    FailurePolicy,
    ReliableSubscriptionState,
    SubType,
)

CONSUMERS = {SubType.EXCLUSIVE: 1, SubType.FAILOVER: 2, SubType.SHARED: 4, SubType.KEY_SHARED: 4}
KEY_POOL = 1_000
POLICY = FailurePolicy(ack_timeout_ms=30_000)


def make_keys(sub_type: SubType, n: int) -> list[str]:
    if sub_type is not SubType.KEY_SHARED:
        return [""] * n
    rng = random.Random(7)
    pool = [f"key-{i}" for i in range(KEY_POOL)]
    return [rng.choice(pool) for _ in range(n)]


def make_state(sub_type: SubType, window: int) -> ReliableSubscriptionState:
    s = ReliableSubscriptionState(sub_type, start_offset=0, window=window, policy=POLICY)
    for cid in range(1, CONSUMERS[sub_type] + 1):
        s.attach(cid, (), 0)
    return s


def per_message(s: ReliableSubscriptionState, keys: list[str]) -> int:
    n = len(keys)
    now = 0
    acked = 0
    offer, poll, on_ack, capacity = s.offer, s.poll, s.on_ack, s.capacity
    while acked < n:
        now += 1
        nxt = s.next_offset
        for off in range(nxt, min(n, nxt + capacity())):
            offer(off, keys[off], now)
        for d in poll(now):
            on_ack(d.offset, now)
            acked += 1
    return acked


def batch(s: ReliableSubscriptionState, keys: list[str]) -> int:
    n = len(keys)
    now = 0
    acked = 0
    offer_batch, poll, ack_range, capacity = s.offer_batch, s.poll, s.ack_range, s.capacity
    while acked < n:
        now += 1
        nxt = s.next_offset
        room = min(n - nxt, capacity())
        if room > 0:
            offer_batch(nxt, keys[nxt : nxt + room], now)
        ds = poll(now)
        if ds:  # deliveries come in offset order (retries first, none here)
            acked += ack_range(ds[0].offset, ds[-1].offset, now)
    return acked


def cumulative(s: ReliableSubscriptionState, keys: list[str]) -> int:
    n = len(keys)
    now = 0
    acked = 0
    offer_batch, poll, ack_upto, capacity = s.offer_batch, s.poll, s.ack_upto, s.capacity
    while acked < n:
        now += 1
        nxt = s.next_offset
        room = min(n - nxt, capacity())
        if room > 0:
            offer_batch(nxt, keys[nxt : nxt + room], now)
        highest: dict[int, int] = {}
        for d in poll(now):
            highest[d.consumer_id] = d.offset
        for cid, last in highest.items():
            acked += ack_upto(last, cid, now)
    return acked


APIS: dict[str, Callable[[ReliableSubscriptionState, list[str]], int]] = {
    "per-message": per_message,
    "batch": batch,
    "cumulative": cumulative,
}


def measure(sub_type: SubType, api: str, messages: int, window: int) -> dict[str, object]:
    keys = make_keys(sub_type, messages)
    s = make_state(sub_type, window)
    gc.collect()
    start, cpu_start = time.perf_counter(), time.process_time()
    done = APIS[api](s, keys)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    assert done == messages and s.cursor == messages - 1, (done, s.cursor)
    return {
        "type": sub_type.name,
        "api": api,
        "messages": messages,
        "seconds": round(elapsed, 3),
        "msgs_per_s": round(messages / elapsed),
        "us_per_msg": round(elapsed * 1e6 / messages, 3),
        "cpu_us_per_msg": round(cpu * 1e6 / messages, 3),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=1_000_000)
    p.add_argument("--window", type=int, default=10_000)
    p.add_argument("--types", default="exclusive,failover,shared,key_shared")
    p.add_argument("--api", default="per-message,batch,cumulative")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    types = [SubType[t.strip().upper()] for t in args.types.split(",")]
    apis = [a.strip() for a in args.api.split(",")]
    rows = []
    for sub_type in types:
        for api in apis:
            if api != "per-message" and not hasattr(ReliableSubscriptionState, "offer_batch"):
                continue
            row = measure(sub_type, api, args.messages, args.window)
            rows.append(row)
            if not args.json:
                print(
                    f"{row['type']:<11} {row['api']:<12} {row['msgs_per_s']:>10,} msg/s "
                    f"{row['us_per_msg']:>7} us/msg   (cpu {row['cpu_us_per_msg']} us/msg)",
                    flush=True,
                )
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
