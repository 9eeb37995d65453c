"""The replication cases (`ister bench --cases replicated`): Ister clusters at RF 1 and RF 3 next to NATS
JetStream R1 (one node) and R3 (three nodes), in one run, on this machine.

For each replication factor a fresh cluster (ister.benchmark.cluster: etcd + 3 cluster-mode brokers,
fsync always, the factor in the brokers' config file) runs:
  batch API      durable publish (`ister_cases.publish`: send_batch of 4,096, 8 in flight) and e2e latency
                 at 1,000 msg/s (`ister_cases.e2e_latency`: open loop, consumer in another process)
  danube-client  sequential and 64-in-flight durable publish and e2e latency at 1,000 msg/s (the
                 danube_cases module in its own process, `--url` pointing at the cluster)
Clients start from the first broker; each topic's owner is found by lookup, as clients do. CPU per message
is the sum over the three brokers (with RF 3 the followers' work counts).

An RF the brokers refuse (the settings do not exist yet) is reported "not available" with the reason and
the run goes on. JetStream runs through ister.benchmark.nats_cluster (own process) with 1 node / R1 and
3 nodes / R3, `sync_interval: always` on every node, the same client code for both.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import uvloop

from ister.benchmark import ister_cases
from ister.benchmark.cluster import BenchCluster, ReplicationUnavailable, owner_of
from ister.benchmark.stats import host_cpu_share, host_cpu_ticks

Progress = Callable[[str], None]

# The targets (issue 16, Proof).
TARGET_RF3_PUBLISH_MSGS_PER_S = 100_000
TARGET_RF3_VS_JETSTREAM_R3 = 20.0
TARGET_RF3_E2E_P99_VS_RF1 = 2.0

BATCH_TOPIC = "/default/bench_batch"
LATENCY_TOPIC = "/default/bench_latency"


@dataclass(frozen=True)
class ReplicationOptions:
    brokers: int = 3
    factors: tuple[int, ...] = (1, 3)
    fsync: str = "always"
    messages: int = 1_000_000
    latency_seconds: float = 10.0
    durable: bool = False  # a shared file:// durable tier for the brokers
    danube: bool = True
    danube_seq: int = 3_000
    danube_pipe: int = 20_000
    nats: bool = True
    nats_seq: int = 3_000
    nats_pipe: int = 100_000


def run_factor(rf: int, opts: ReplicationOptions, progress: Progress) -> dict[str, Any]:
    """Every Ister case against a fresh cluster with replication factor `rf`."""
    out: dict[str, Any] = {"replication_factor": rf, "brokers": opts.brokers, "cases": {}}
    try:
        cluster = BenchCluster(opts.brokers, replication_factor=rf, fsync=opts.fsync, durable=opts.durable)
        cluster.start()
    except ReplicationUnavailable as exc:
        out["available"] = False
        out["reason"] = str(exc)
        progress(f"RF {rf}: {exc}")
        return out
    out["available"] = True
    out["broker_pids"] = cluster.pids
    out["broker_urls"] = cluster.urls
    out["etcd_pid"] = cluster.etcd.proc.pid if cluster.etcd is not None and cluster.etcd.proc else None
    out["config"] = cluster.config()  # what the brokers' config file held (nothing: the broker's own RF 1)
    cases: dict[str, Any] = out["cases"]
    try:
        progress(f"Ister cluster RF {rf}: brokers {cluster.pids} on {', '.join(cluster.urls)}")

        def timed(key: str, case: Any) -> None:
            before = host_cpu_ticks()
            result: dict[str, Any] = uvloop.run(case)
            result["host_cpu"] = host_cpu_share(before, host_cpu_ticks())
            cases[key] = result

        progress(f"RF {rf} batch API: durable publish of {opts.messages:,} messages")
        timed(
            "ister_publish",
            ister_cases.publish(cluster.url, BATCH_TOPIC, opts.messages, broker_cpu=cluster.cpu_seconds),
        )
        progress(f"RF {rf} batch API: e2e latency at 1,000 msg/s for {opts.latency_seconds:g} s")
        timed(
            "ister_e2e",
            ister_cases.e2e_latency(
                cluster.url, LATENCY_TOPIC, seconds=opts.latency_seconds, broker_cpu=cluster.cpu_seconds
            ),
        )
        out["owners"] = {t: asyncio.run(owner_of(cluster.url, t)) for t in (BATCH_TOPIC, LATENCY_TOPIC)}
        if opts.danube:
            if importlib.util.find_spec("danube") is None:
                out["danube_note"] = "danube-client is not installed (a dev dependency): skipped"
            else:
                cases.update(_danube(cluster, opts, progress))
        # Replication at work shows as replica metrics (issue 16: ister_replica_lag_messages); record which.
        out["replica_metrics"] = cluster.metric_families("ister_replica")
    finally:
        cluster.stop()
    return out


def _danube(cluster: BenchCluster, opts: ReplicationOptions, progress: Progress) -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-m",
        "ister.benchmark.danube_cases",
        "--url",
        cluster.url,
        "--broker-pids",
        ",".join(map(str, cluster.pids)),
        "--cases",
        "seq,pipe,e2e",
        "--n-seq",
        str(opts.danube_seq),
        "--n-pipe",
        str(opts.danube_pipe),
        "--latency-seconds",
        str(opts.latency_seconds),
    ]
    progress(f"RF {cluster.replication_factor} danube-client cases (a separate process)")
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None, timeout=1800, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the danube-client cases exited with {done.returncode}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def run_jetstream(nodes: int, opts: ReplicationOptions, progress: Progress) -> dict[str, Any]:
    """ister.benchmark.nats_cluster in its own process: `nodes` servers, streams with `nodes` replicas."""
    cmd = [
        sys.executable,
        "-m",
        "ister.benchmark.nats_cluster",
        "--nodes",
        str(nodes),
        "--n-seq",
        str(opts.nats_seq),
        "--n-pipe",
        str(opts.nats_pipe),
        "--latency-seconds",
        str(opts.latency_seconds),
    ]
    progress(f"NATS JetStream {nodes} node(s), R{nodes}, sync_interval always (a separate process)")
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None, timeout=1800, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the JetStream R{nodes} cases exited with {done.returncode}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _get(d: Any, *path: str) -> float | None:
    for key in path:
        if not isinstance(d, dict) or key not in d:
            return None
        d = d[key]
    return float(d) if isinstance(d, int | float) else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


# (name, Ister case key, JetStream key, kind): kind "rate" compares msgs/s, "latency" the e2e p99.
COMPARED = [
    ("publish", "ister_publish", "pipelined_best_msgs_per_s", "rate"),
    ("e2e_p99", "ister_e2e", "e2e", "latency"),
    ("danube_seq_publish", "danube_seq_publish", "seq_publish", "rate"),
    ("danube_pipe_publish", "danube_pipe_publish", "pipelined_best_msgs_per_s", "rate"),
    ("danube_e2e_p99", "danube_e2e", "e2e", "latency"),
]


def _value(section: dict[str, Any] | None, key: str, kind: str) -> float | None:
    if key == "pipelined_best_msgs_per_s":
        return _get(section, key)
    return _get(section, key, "latency_us", "p99") if kind == "latency" else _get(section, key, "msgs_per_s")


def ratios(ister: dict[str, Any], js: dict[str, Any]) -> dict[str, float | None]:
    """RF 3 against RF 1 and against JetStream R3; RF 1 against JetStream R1; JetStream R3 against R1."""
    rf1 = (ister.get("rf1") or {}).get("cases")
    rf3 = (ister.get("rf3") or {}).get("cases")
    out: dict[str, float | None] = {}
    for name, case, js_key, kind in COMPARED:
        out[f"rf3_vs_rf1_{name}"] = _ratio(_value(rf3, case, kind), _value(rf1, case, kind))
        out[f"rf3_vs_jetstream_r3_{name}"] = _ratio(
            _value(rf3, case, kind), _value(js.get("r3"), js_key, kind)
        )
        out[f"rf1_vs_jetstream_r1_{name}"] = _ratio(
            _value(rf1, case, kind), _value(js.get("r1"), js_key, kind)
        )
    out["jetstream_r3_vs_r1_publish"] = _ratio(
        _get(js.get("r3"), "pipelined_best_msgs_per_s"), _get(js.get("r1"), "pipelined_best_msgs_per_s")
    )
    out["jetstream_r3_vs_r1_e2e_p99"] = _ratio(
        _get(js.get("r3"), "e2e", "latency_us", "p99"), _get(js.get("r1"), "e2e", "latency_us", "p99")
    )
    return out


def targets(ister: dict[str, Any], rat: dict[str, float | None]) -> list[dict[str, Any]]:
    def row(
        name: str, value: float | None, threshold: float, higher_is_better: bool = True
    ) -> dict[str, Any]:
        met = None if value is None else (value >= threshold if higher_is_better else value <= threshold)
        return {"target": name, "value": value, "threshold": threshold, "met": met}

    rf3 = (ister.get("rf3") or {}).get("cases")
    return [
        row(
            "RF 3 batch API durable publish >= 100,000 msg/s",
            _get(rf3, "ister_publish", "msgs_per_s"),
            TARGET_RF3_PUBLISH_MSGS_PER_S,
        ),
        row(
            "RF 3 batch API durable publish >= 20x JetStream R3 (pipelined)",
            rat["rf3_vs_jetstream_r3_publish"],
            TARGET_RF3_VS_JETSTREAM_R3,
        ),
        row(
            "RF 3 batch API e2e p99 at 1,000 msg/s <= 2x RF 1",
            rat["rf3_vs_rf1_e2e_p99"],
            TARGET_RF3_E2E_P99_VS_RF1,
            higher_is_better=False,
        ),
    ]


def run(opts: ReplicationOptions, progress: Progress = lambda _: None) -> dict[str, Any]:
    """Ister RF 1 and RF 3, then JetStream R1 and R3; one JSON-able dict."""
    notes: list[str] = []
    host_cpu: dict[str, Any] = {}
    ister: dict[str, Any] = {}
    for rf in opts.factors:
        ticks = host_cpu_ticks()
        got = ister[f"rf{rf}"] = run_factor(rf, opts, progress)
        if got["available"]:
            host_cpu[f"ister_rf{rf}"] = host_cpu_share(ticks, host_cpu_ticks())
        if not got["available"]:
            notes.append(f"Ister RF {rf}: {got['reason']}")
        elif rf > 1 and not got.get("replica_metrics"):
            notes.append(
                f"Ister RF {rf}: the brokers accepted the setting but export no ister_replica_* metrics: "
                "check that replication is really active before trusting these figures"
            )
        if got.get("danube_note"):
            notes.append(got["danube_note"])
    js: dict[str, Any] = {}
    if opts.nats:
        if importlib.util.find_spec("nats") is None:
            notes.append("nats-py is not installed (a dev dependency): JetStream skipped")
        else:
            for nodes in sorted({1, opts.brokers}):
                ticks = host_cpu_ticks()
                try:
                    js[f"r{nodes}"] = run_jetstream(nodes, opts, progress)
                except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
                    notes.append(f"JetStream R{nodes} failed: {exc}")
                host_cpu[f"jetstream_r{nodes}"] = host_cpu_share(ticks, host_cpu_ticks())
    rat = ratios(ister, js)
    return {
        "ister": ister,
        "jetstream": js,
        "ratios": rat,
        "targets": targets(ister, rat),
        "host_cpu": host_cpu,
        "notes": notes,
        "options": {k: list(v) if isinstance(v, tuple) else v for k, v in opts.__dict__.items()},
    }
