"""The web console at many topics (issue 42): how long the topics page, a search and the overview take at
10,000 and 100,000 topics, against a real broker and a real `ister console` process.

usage: python bench/console_bench.py [--topics 10000 100000] [--runs 5] [--json]

* setup: one standalone `ister broker` (topic limit raised above N) holding N non-reliable topics, made as
  N/1000 partitioned topics of 1,000 partitions each (every partition is a topic of its own in the
  listing: the fastest real way to make them), 4 creations at a time; then `ister console` on it.
* page: GET /topics (the first page of 50, by name); deep: page 1,000 of it; search: GET
  /topics?q=<substring matching 11 topics>; by_broker and by_delivery: the first page sorted so. Each is
  one IsterAdmin.ListTopics call: the broker filters, sorts and pages, and the console keeps nothing.
* overview_cold: the console's first GET /fragments/overview (nothing kept yet); overview: the same right
  after the console's topic counts expired (3 s, or 10 times as long as counting took): ListTopics with no
  page, plus the broker list, rates (ListSubscriptionStats with totals_only) and health.
* the RPCs alone: ListTopics for the counts, for the first page, and the old full ListNamespaceTopics;
  ListSubscriptionStats with totals_only (the overview's since issue 42) and the full listing it replaced.
Times are HTTP round trips seen by a client on the same machine (urllib, a new connection each), the
median of `--runs`. Not a test; numbers depend on the machine and its load. Results: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import grpc

from ister.console.source import COUNTS_CACHE_SECONDS, LIST_SHARE
from ister.devcluster.broker import BrokerNode
from ister.devcluster.ports import free_port, wait_port
from ister.wire.gen import DanubeAdmin_pb2 as apb
from ister.wire.gen import DanubeAdmin_pb2_grpc as apb_grpc
from ister.wire.gen import ister_v1_pb2 as ipb
from ister.wire.gen import ister_v1_pb2_grpc as ipb_grpc

PARTITIONS = 1000
# The old full listing is ~46 bytes a topic: 4.6 MB at 100,000, above gRPC's 4 MiB default receive limit.
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]


def make_topics(admin_addr: str, count: int) -> float:
    """`count` topics (a multiple of 1,000); the seconds it took."""
    started = time.monotonic()
    with grpc.insecure_channel(admin_addr) as channel:
        stub = apb_grpc.TopicAdminStub(channel)
        names = [f"/default/fleet-{f}" for f in range(count // PARTITIONS)]
        for i in range(0, len(names), 4):
            calls = [
                stub.CreatePartitionedTopic.future(
                    apb.PartitionedTopicRequest(base_name=n, partitions=PARTITIONS), timeout=600
                )
                for n in names[i : i + 4]
            ]
            for call in calls:
                call.result()
    return time.monotonic() - started


def fetch(url: str) -> tuple[float, str]:
    started = time.monotonic()
    with urllib.request.urlopen(url, timeout=120) as resp:
        body = resp.read().decode()
    return time.monotonic() - started, body


def measure(base: str, runs: int, count: int) -> dict[str, float]:
    cases = {
        "page": ("/topics", f"{count} topics match"),
        "deep": ("/topics?page=1000&size=10", f"page 1000 of {count // 10}"),
        "search": ("/topics?q=fleet-3-part-41", "11 topics match"),
        "by_broker": ("/topics?sort=broker", f"{count} topics match"),
        "by_delivery": ("/topics?sort=delivery", f"{count} topics match"),
        "overview": ("/fragments/overview", f'id="total-topics">{count}<'),
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    slowest = 0.0
    for _ in range(runs):
        for key, (path, expected) in cases.items():
            if key == "overview":
                # Let the console's counts expire: it keeps them max(3 s, 10 x the time counting took).
                time.sleep(max(COUNTS_CACHE_SECONDS, slowest / LIST_SHARE) + 0.2)
            took, body = fetch(base + path)
            if key == "overview":
                slowest = max(slowest, took)
            assert expected in body, (key, body[:2000])
            times[key].append(took)
    return {k: statistics.median(v) for k, v in times.items()}


def rpcs(admin_addr: str, count: int, runs: int) -> dict[str, float]:
    """ListTopics for the counts and for a first page, and the old full listing, each the median."""
    keys = ("counts_rpc_s", "page_rpc_s", "full_list_rpc_s", "subs_totals_rpc_s", "subs_full_rpc_s")
    out: dict[str, list[float]] = {k: [] for k in keys}
    with grpc.insecure_channel(admin_addr, options=CHANNEL_OPTIONS) as channel:
        list_topics = channel.unary_unary(
            "/ister.v1.IsterAdmin/ListTopics",
            request_serializer=ipb.ListTopicsRequest.SerializeToString,
            response_deserializer=ipb.ListTopicsResponse.FromString,
        )
        full = apb_grpc.TopicAdminStub(channel).ListNamespaceTopics
        subs = ipb_grpc.IsterAdminStub(channel).ListSubscriptionStats
        for _ in range(runs):
            for key, call in (
                ("counts_rpc_s", lambda: list_topics(ipb.ListTopicsRequest(limit=0), timeout=120)),
                ("page_rpc_s", lambda: list_topics(ipb.ListTopicsRequest(limit=50), timeout=120)),
                ("full_list_rpc_s", lambda: full(apb.NamespaceRequest(name="default"), timeout=120)),
                (
                    "subs_totals_rpc_s",
                    lambda: subs(ipb.ListSubscriptionStatsRequest(totals_only=True), timeout=120),
                ),
                ("subs_full_rpc_s", lambda: subs(ipb.ListSubscriptionStatsRequest(), timeout=120)),
            ):
                started = time.monotonic()
                answer = call()
                out[key].append(time.monotonic() - started)
                assert getattr(answer, "total", count) == count
    return {k: statistics.median(v) for k, v in out.items()}


def run(count: int, runs: int) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="ister-console-bench-"))
    env = {"ISTER_LIMITS__MAX_TOPICS_PER_BROKER": str(count + 1000)}
    broker = BrokerNode(root / "data", "--log-level", "warning", env=env)
    broker.start()
    console = None
    try:
        created = make_topics(broker.admin_addr, count)
        port = free_port()
        cmd = [sys.executable, "-m", "ister.cli", "console", "--admin-addr", broker.admin_addr]
        console = subprocess.Popen([*cmd, "--listen", f"127.0.0.1:{port}"])
        wait_port(port, console, 60, "console")
        result: dict[str, float] = {"topics": count, "create_s": created}
        took, body = fetch(f"http://127.0.0.1:{port}/fragments/overview")
        assert f'id="total-topics">{count}<' in body, body[:2000]
        result["overview_cold"] = took
        result.update(rpcs(broker.admin_addr, count, runs))
        result.update(measure(f"http://127.0.0.1:{port}", runs, count))
        return result
    finally:
        if console is not None:
            console.terminate()
            console.wait(10)
        broker.stop()


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--topics", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    for count in args.topics:
        if count % PARTITIONS:
            parser.error(f"--topics must be multiples of {PARTITIONS}")
        result = run(count, args.runs)
        if args.json:
            print(json.dumps(result))
        else:
            ms = {k: f"{v * 1000:.0f} ms" for k, v in result.items() if k not in ("topics", "create_s")}
            shown = ", ".join(f"{k} {v}" for k, v in ms.items())
            print(f"{count:>7} topics: made in {result['create_s']:.1f} s; {shown}")


if __name__ == "__main__":
    main()
