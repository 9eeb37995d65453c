"""`ister bench --quick --no-nats --json` end to end: it runs, prints one JSON object, every rate is positive.

A smoke test of the benchmark machinery only; no figure is checked against a target (benchmarks are never
timed tests)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

ISTER_CASES = ("ister_publish", "ister_consume_ack", "ister_e2e")
DANUBE_CASES = (
    "danube_seq_publish",
    "danube_pipe_publish",
    "danube_consume_ack",
    "danube_e2e",
    "noop_seq_publish",
    "noop_pipe_publish",
    "noop_consume_ack",
    "noop_consume_ack_unbounded",
)


@pytest.mark.timeout(150)
def test_quick_bench_json() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ister.cli", "bench", "--quick", "--no-nats", "--json"],
        capture_output=True,
        text=True,
        timeout=140,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout)
    for key in ("started_at", "host", "loadavg_start", "options", "cases", "ratios", "targets", "notes"):
        assert key in result
    assert result["jetstream"] is None
    assert result["options"]["quick"] is True
    expected = ISTER_CASES
    if importlib.util.find_spec("danube") is not None:
        expected += DANUBE_CASES
    for name in expected:
        case = result["cases"][name]
        assert case["msgs_per_s"] > 0, name
        assert case["mb_per_s"] > 0, name
        assert case["messages"] > 0, name
    publish, consume = result["cases"]["ister_publish"], result["cases"]["ister_consume_ack"]
    assert consume["messages"] == publish["total_published"]
    assert consume["unacked_after"] == 0
    for name in ("ister_e2e", *(("danube_e2e",) if "danube_e2e" in result["cases"] else ())):
        e2e = result["cases"][name]
        assert e2e["received"] == e2e["sent"]
        assert 0 < e2e["latency_us"]["p50"] <= e2e["latency_us"]["p99"] <= e2e["latency_us"]["p999"]
    vs_jetstream = next(t for t in result["targets"] if "JetStream" in t["target"])
    assert vs_jetstream["met"] is None  # not measured without JetStream
