"""danube-client consume + ack against its streaming ceiling, in alternating pairs (issue 21).

usage: python bench/danube_consume_ceiling.py [--runs 2] [--messages 20000] [--window 10]

Each run: a fresh `ister broker` (fsync always), 20,000 durable publishes from the official client (64 in
flight), then a consumer reads them back acking each (64 acks in flight), as `ister bench`'s
danube_consume_ack; then the same consumer loop against `ister.benchmark.noop_server`, which streams made-up
100-byte messages holding at most `--window` unacknowledged (the broker's default is 10). Prints one JSON
line per run: both rates, their ratio and the broker's CPU per consumed message. Not a test: timings depend
on the machine and its load. Results go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import uvloop

from ister.benchmark import danube_cases
from ister.benchmark.broker import BenchBroker
from ister.devcluster.ports import free_port, stop_process, wait_port


def one(run: int, n: int, window: int) -> dict[str, float]:
    with BenchBroker(fsync="always") as broker:
        _, con = uvloop.run(
            danube_cases.pipe_publish_and_consume(broker.url, f"/default/dc{run}", n, broker.cpu_seconds)
        )
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ister.benchmark.noop_server", str(port), str(window)])
    try:
        wait_port(port, proc, 30.0, "the no-op server")
        noop = uvloop.run(danube_cases.consume_only(f"http://127.0.0.1:{port}", "/default/noop", n))
    finally:
        stop_process(proc)
    return {
        "ister_consume_ack": round(con["msgs_per_s"]),
        "noop_consume_ack": round(noop["msgs_per_s"]),
        "ratio": round(con["msgs_per_s"] / noop["msgs_per_s"], 3),
        "broker_cpu_us_per_msg": round(con["broker_cpu_us_per_msg"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--window", type=int, default=danube_cases.BROKER_WINDOW)
    args = parser.parse_args()
    for run in range(args.runs):
        print(json.dumps(one(run, args.messages, args.window)), flush=True)


if __name__ == "__main__":
    main()
