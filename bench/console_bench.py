"""The web console at many topics (issue 42): how long the topics list page and a search take at 10,000
and 100,000 topics, against a real broker and a real `ister console` process.

usage: python bench/console_bench.py [--topics 10000 100000] [--runs 5] [--json]

* setup: one standalone `ister broker` (topic limit raised above N) holding N non-reliable topics, made as
  N/1000 partitioned topics of 1,000 partitions each (every partition is a topic of its own in the
  listing: the fastest real way to make them), 4 creations at a time; then `ister console` on it.
* cold: GET /topics (first page of 50, sorted by name) right after the console's topic cache expired
  (3 s, or 10 times as long as the last listing took, whichever is longer):
  the console lists every namespace's topics from the admin API, then searches, sorts and renders.
  warm: the same within the cache's life (search, sort and render only).
* search: GET /topics?q=<substring matching 11 topics>, cold and warm likewise.
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

from ister.console.source import CHANNEL_OPTIONS, LIST_SHARE, TOPIC_CACHE_SECONDS
from ister.devcluster.broker import BrokerNode
from ister.devcluster.ports import free_port, wait_port
from ister.wire.gen import DanubeAdmin_pb2 as apb
from ister.wire.gen import DanubeAdmin_pb2_grpc as apb_grpc

PARTITIONS = 1000


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
    cases = {"page": "/topics", "search": "/topics?q=fleet-3-part-41"}
    expected = {"page": f"{count} topics match", "search": "11 topics match"}
    times: dict[str, list[float]] = {f"{k}_{w}": [] for k in cases for w in ("cold", "warm")}
    slowest = 0.0
    for _ in range(runs):
        for key, path in cases.items():
            # Let the console's topic list expire: it keeps it max(3 s, 10 x the listing's time), and the
            # listing took less than the slowest cold page so far.
            time.sleep(max(TOPIC_CACHE_SECONDS, slowest / LIST_SHARE) + 0.2)
            cold, body = fetch(base + path)
            slowest = max(slowest, cold)
            assert expected[key] in body, body[:2000]
            warm, _ = fetch(base + path)
            times[f"{key}_cold"].append(cold)
            times[f"{key}_warm"].append(warm)
    return {k: statistics.median(v) for k, v in times.items()}


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
        with grpc.insecure_channel(broker.admin_addr, options=CHANNEL_OPTIONS) as channel:
            raw = channel.unary_unary(
                "/danube_admin.TopicAdmin/ListNamespaceTopics",
                request_serializer=apb.NamespaceRequest.SerializeToString,
                response_deserializer=None,  # bytes: the broker's part and the transport, without parsing
            )
            started = time.monotonic()
            payload = raw(apb.NamespaceRequest(name="default"), timeout=120)
            list_rpc = time.monotonic() - started
            listed = apb.TopicInfoListResponse.FromString(payload)
            parse = time.monotonic() - started - list_rpc
        assert len(listed.topics) == count
        result = {"topics": count, "create_s": created, "list_rpc_s": list_rpc, "parse_s": parse}
        result["list_mb"] = len(payload) / 1e6
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
            ms = {
                k: f"{v * 1000:.0f} ms"
                for k, v in result.items()
                if k.endswith(("cold", "warm", "rpc_s", "parse_s"))
            }
            print(
                f"{count:>7} topics: made in {result['create_s']:.1f} s; ListNamespaceTopics "
                f"{ms['list_rpc_s']} ({result['list_mb']:.1f} MB, parsed in {ms['parse_s']}); "
                f"topics page cold {ms['page_cold']}, warm {ms['page_warm']}; "
                f"search cold {ms['search_cold']}, warm {ms['search_warm']}"
            )


if __name__ == "__main__":
    main()
