"""Scrape time and body size of the broker's registry with 10,000 and 100,000 topics (issue 38). Not a test.

usage: python bench/metrics_scrape_bench.py [--topics 10000 100000] [--max-topics 500] [--repeat 5] [--json]

In-process: the registry a broker fills (everything `ister.app` imports), with every per-topic family
given series for N topics as a loaded reliable topic has them (one subscription each: its lag, polls,
redeliveries, nacks, dead letters and messages/bytes out; the topic's messages/bytes in, skipped offsets,
WAL/object bytes, start/end offsets and export backlog). For each N it renders /metrics the way the
exporter thread does (`generate_latest`), with the default bound (`metrics.max_topics`, 500 topics
exported, the rest counted in `ister_metrics_topics{series="omitted"}`) and without it (every topic
exported), and reports the render time (median of `--repeat`), the body size, its gzip size (what a
Prometheus that sends Accept-Encoding: gzip receives) and the process's RSS growth for the series.

Numbers depend on the machine and its load. Results go to docs/benchmarks.md ("Metrics scrape").
"""

from __future__ import annotations

import argparse
import gzip
import json
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from prometheus_client import REGISTRY, generate_latest  # noqa: E402

import ister.app  # noqa: E402, F401 - registers every metric of the broker
from ister.broker import metrics  # noqa: E402


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def fill(topics: int) -> None:
    for i in range(topics):
        topic = f"/default/scrape_bench_{i}"
        for family in metrics.SUBSCRIPTION_FAMILIES:
            family.labels(topic, "sub").inc(i % 97)
        for family in metrics.TOPIC_OWN_FAMILIES:
            family.labels(topic).inc(i % 89)


def clear() -> None:
    for family in metrics.TOPIC_FAMILIES:
        family.clear()


def measure(max_topics: int, repeat: int) -> dict[str, Any]:
    metrics.configure(per_topic=True, max_topics=max_topics)
    times = []
    body = b""
    for _ in range(repeat):
        started = time.perf_counter()
        body = generate_latest(REGISTRY)
        times.append(time.perf_counter() - started)
    started = time.perf_counter()
    zipped = gzip.compress(body, compresslevel=5)  # as the exporter does (server/metrics_http.py)
    gzip_s = time.perf_counter() - started
    return {
        "max_topics": max_topics,
        "render_ms_median": round(statistics.median(times) * 1000, 1),
        "render_ms_min": round(min(times) * 1000, 1),
        "gzip_ms": round(gzip_s * 1000, 1),
        "bytes": len(body),
        "gzip_bytes": len(zipped),
        "lines": body.count(b"\n"),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--topics", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--max-topics", type=int, default=500, help="the bound (metrics.max_topics)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    results: list[dict[str, Any]] = []
    for n in args.topics:
        clear()
        before = rss_mib()
        started = time.perf_counter()
        fill(n)
        fill_s = time.perf_counter() - started
        row: dict[str, Any] = {"topics": n, "fill_s": round(fill_s, 2), "rss_growth_mib": None}
        row["bounded"] = measure(args.max_topics, args.repeat)
        row["unbounded"] = measure(n, 1)  # seconds at 100,000 topics: once
        row["rss_growth_mib"] = round(rss_mib() - before, 1)  # ru_maxrss: a high-water mark
        results.append(row)
        print(f"metrics_scrape_bench: {n} topics done", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    head = ("topics", "exported", "render ms", "gzip ms", "body", "gzip", "lines")
    print("{:>8} {:>9} {:>10} {:>8} {:>11} {:>10} {:>9}".format(*head))
    for row in results:
        for key in ("bounded", "unbounded"):
            r = row[key]
            exported = min(r["max_topics"], row["topics"])
            print(
                f"{row['topics']:>8} {exported:>9} {r['render_ms_median']:>10} {r['gzip_ms']:>8} "
                f"{r['bytes']:>11,} {r['gzip_bytes']:>10,} {r['lines']:>9,}"
            )
        print(
            f"{'':>8} series for {row['topics']} topics: {row['rss_growth_mib']} MiB RSS (high-water growth)"
        )


if __name__ == "__main__":
    main()
