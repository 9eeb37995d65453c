"""The whole suite: batch-API cases, danube-client cases, JetStream, then ratios and targets, in one run."""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import uvloop

from ister.benchmark import compression_cases, ister_cases, replication
from ister.benchmark import nats as nats_peer
from ister.benchmark.broker import BenchBroker
from ister.benchmark.stats import host_cpu_share, host_cpu_ticks

ALL_CASES = frozenset({"publish", "consume", "latency"})

# The targets (100-byte messages, one broker process, 2-core machine, fsync always).
TARGET_PUBLISH_MSGS_PER_S = 250_000
TARGET_PUBLISH_VS_JETSTREAM = 40.0
TARGET_CONSUME_MSGS_PER_S = 100_000
TARGET_E2E_P99_US = 2_000


@dataclass(frozen=True)
class Options:
    fsync: str = "always"
    messages: int = 1_000_000
    latency_seconds: float = 10.0
    cases: frozenset[str] = ALL_CASES
    danube: bool = True
    danube_seq: int = 3_000
    danube_pipe: int = 20_000
    nats: bool = True
    nats_script: Path = field(default_factory=nats_peer.default_script)
    nats_seq: int = 3_000
    nats_pipe: int = 100_000
    quick: bool = False
    # `--cases replicated`: Ister clusters at RF 1 and RF 3 next to JetStream R1 and R3 (replication.py)
    replicated: bool = False
    replicated_nats_pipe: int = 20_000  # JetStream R1/R3 pipelined publishes (about 5k msg/s each here)

    @classmethod
    def quick_run(cls, **overrides: Any) -> Options:
        """Small counts for a smoke run (tens of seconds without JetStream)."""
        base: dict[str, Any] = dict(
            messages=20_000,
            latency_seconds=1.0,  # the danube-client's e2e case sends slower than 1k/s here: 1 s takes ~5 s
            danube_seq=300,
            danube_pipe=2_000,
            nats_seq=300,
            nats_pipe=5_000,
            replicated_nats_pipe=2_000,
            quick=True,
        )
        base.update(overrides)
        return cls(**base)


Progress = Callable[[str], None]


def _loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def run_ister(opts: Options, progress: Progress) -> dict[str, Any]:
    if not opts.cases:
        return {}
    with BenchBroker(fsync=opts.fsync) as broker:
        progress(f"ister broker pid {broker.pid} on {broker.url} (fsync {opts.fsync})")
        out = ister_cases.run_all(
            broker.url,
            messages=opts.messages,
            latency_seconds=opts.latency_seconds,
            cases=opts.cases,
            broker_cpu=broker.cpu_seconds,
            progress=progress,
        )
        if "compression" in opts.cases:
            n = max(1, opts.messages // 10)
            progress(f"batch API: each codec on 1 KiB JSON and random payloads, {n:,} messages each")
            case = compression_cases.run(
                broker.url, n, broker_cpu=broker.cpu_seconds, progress=progress, admin_addr=broker.admin_addr
            )
            out["ister_compression"] = uvloop.run(case)
        return out


def run_danube(opts: Options, progress: Progress) -> dict[str, Any]:
    """The danube-client cases in their own process (see ister.benchmark.danube_cases)."""
    cmd = [
        sys.executable,
        "-m",
        "ister.benchmark.danube_cases",
        "--fsync",
        opts.fsync,
        "--n-seq",
        str(opts.danube_seq),
        "--n-pipe",
        str(opts.danube_pipe),
        "--latency-seconds",
        str(opts.latency_seconds),
    ]
    progress("danube-client cases (a separate process)")
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None, timeout=1800, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the danube-client cases exited with {done.returncode}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _get(d: dict[str, Any] | None, *path: str) -> float | None:
    cur: Any = d
    for key in path:
        if not isinstance(cur, dict) or key not in cur:
            return None
        cur = cur[key]
    return float(cur) if isinstance(cur, int | float) else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def ratios(cases: dict[str, Any], js: dict[str, Any] | None) -> dict[str, float | None]:
    pipelined = _get(js, "pipelined_best_msgs_per_s")
    pull = _get(js, "pull_consume", "msgs_per_s")
    js_p99 = _get(js, "e2e", "latency_us", "p99")
    out = {
        "ister_publish_vs_jetstream_pipelined": _ratio(_get(cases, "ister_publish", "msgs_per_s"), pipelined),
        "ister_consume_ack_vs_jetstream_pull_consume": _ratio(
            _get(cases, "ister_consume_ack", "msgs_per_s"), pull
        ),
        "ister_e2e_p99_vs_jetstream_p99": _ratio(_get(cases, "ister_e2e", "latency_us", "p99"), js_p99),
        "danube_seq_publish_vs_jetstream_seq_publish": _ratio(
            _get(cases, "danube_seq_publish", "msgs_per_s"), _get(js, "seq_publish", "msgs_per_s")
        ),
        "danube_pipe_publish_vs_jetstream_pipelined": _ratio(
            _get(cases, "danube_pipe_publish", "msgs_per_s"), pipelined
        ),
        "danube_consume_ack_vs_jetstream_pull_consume": _ratio(
            _get(cases, "danube_consume_ack", "msgs_per_s"), pull
        ),
        "danube_e2e_p99_vs_jetstream_p99": _ratio(_get(cases, "danube_e2e", "latency_us", "p99"), js_p99),
        "danube_pipe_publish_vs_noop_ceiling": _ratio(
            _get(cases, "danube_pipe_publish", "msgs_per_s"), _get(cases, "noop_pipe_publish", "msgs_per_s")
        ),
        "danube_consume_ack_vs_noop_ceiling": _ratio(
            _get(cases, "danube_consume_ack", "msgs_per_s"), _get(cases, "noop_consume_ack", "msgs_per_s")
        ),
    }
    return out


def targets(cases: dict[str, Any], rat: dict[str, float | None]) -> list[dict[str, Any]]:
    def row(name: str, value: float | None, target: float, higher_is_better: bool = True) -> dict[str, Any]:
        met = None if value is None else (value >= target if higher_is_better else value <= target)
        return {"target": name, "value": value, "threshold": target, "met": met}

    return [
        row(
            "batch API durable publish >= 250,000 msg/s",
            _get(cases, "ister_publish", "msgs_per_s"),
            TARGET_PUBLISH_MSGS_PER_S,
        ),
        row(
            "batch API durable publish >= 40x JetStream durable pipelined",
            rat["ister_publish_vs_jetstream_pipelined"],
            TARGET_PUBLISH_VS_JETSTREAM,
        ),
        row(
            "batch API consume + ack >= 100,000 msg/s",
            _get(cases, "ister_consume_ack", "msgs_per_s"),
            TARGET_CONSUME_MSGS_PER_S,
        ),
        row(
            "batch API e2e p99 <= 2 ms at 1,000 msg/s",
            _get(cases, "ister_e2e", "latency_us", "p99"),
            TARGET_E2E_P99_US,
            higher_is_better=False,
        ),
    ]


def run_replicated(opts: Options, progress: Progress) -> dict[str, Any]:
    return replication.run(
        replication.ReplicationOptions(
            fsync=opts.fsync,
            messages=opts.messages,
            latency_seconds=opts.latency_seconds,
            danube=opts.danube,
            danube_seq=opts.danube_seq,
            danube_pipe=opts.danube_pipe,
            nats=opts.nats,
            nats_seq=opts.nats_seq,
            nats_pipe=opts.replicated_nats_pipe,
        ),
        progress,
    )


def run(opts: Options, progress: Progress = lambda _: None) -> dict[str, Any]:
    """Run everything `opts` asks for; returns the one JSON-able result object. The single-broker part
    (batch API, danube-client, the shared JetStream peer) runs when `opts.cases` names any of its cases."""
    started = time.time()
    load_start = _loadavg()
    notes: list[str] = []
    if opts.quick:
        notes.append("--quick: small counts, figures are a smoke test, not a measurement")
    host_cpu: dict[str, Any] = {}
    ticks = host_cpu_ticks()
    standalone = bool(opts.cases)
    cases: dict[str, Any] = run_ister(opts, progress)
    if standalone:
        host_cpu["ister"], ticks = host_cpu_share(ticks, host_cpu_ticks()), host_cpu_ticks()
    if opts.danube and standalone:
        if importlib.util.find_spec("danube") is None:
            notes.append("danube-client is not installed (a dev dependency): danube-client cases skipped")
        else:
            try:
                cases.update(run_danube(opts, progress))
            except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
                notes.append(f"danube-client cases failed: {exc}")
            host_cpu["danube"], ticks = host_cpu_share(ticks, host_cpu_ticks()), host_cpu_ticks()
    js: dict[str, Any] | None = None
    if opts.nats and standalone:
        if not opts.nats_script.exists():
            notes.append(f"{opts.nats_script} not found: JetStream skipped")
        else:
            progress(f"NATS JetStream sync_always via {opts.nats_script}")
            try:
                js = nats_peer.run(opts.nats_script, opts.nats_seq, opts.nats_pipe)
            except (RuntimeError, ValueError, KeyError, OSError) as exc:
                notes.append(f"JetStream run failed: {exc}")
            host_cpu["jetstream"] = host_cpu_share(ticks, host_cpu_ticks())
    replicated = run_replicated(opts, progress) if opts.replicated else None
    rat = ratios(cases, js)
    options = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(opts).items()}
    options["cases"] = sorted(opts.cases)
    return {
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "duration_s": round(time.time() - started, 1),
        "host": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "loadavg_start": load_start,
        "loadavg_end": _loadavg(),
        "host_cpu": host_cpu,
        "options": options,
        "payload_bytes": 100,
        "cases": cases,
        "jetstream": js,
        "ratios": rat,
        "targets": targets(cases, rat) if standalone else [],
        "replication": replicated,
        "notes": notes,
    }
