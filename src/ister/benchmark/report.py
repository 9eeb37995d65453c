"""Printing a suite result: rich tables for people, one JSON object for scripts."""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

WIDTH = 150  # when printing to a file or pipe (rich would wrap at 80 columns)
TIMES = "\N{MULTIPLICATION SIGN}"

# (case key, label, JetStream key, ratio key, kind): kind "rate" compares msgs/s, "latency" compares p99.
ROWS: list[tuple[str, str, str | None, str | None, str]] = [
    (
        "ister_publish",
        "batch API · durable publish",
        "pipelined_best",
        "ister_publish_vs_jetstream_pipelined",
        "rate",
    ),
    (
        "ister_consume_ack",
        "batch API · consume + ack",
        "pull_consume",
        "ister_consume_ack_vs_jetstream_pull_consume",
        "rate",
    ),
    ("ister_e2e", "batch API · e2e latency at 1k msg/s", "e2e", "ister_e2e_p99_vs_jetstream_p99", "latency"),
    (
        "danube_seq_publish",
        "danube-client · durable publish, sequential",
        "seq_publish",
        "danube_seq_publish_vs_jetstream_seq_publish",
        "rate",
    ),
    (
        "danube_pipe_publish",
        "danube-client · durable publish, 64 in flight",
        "pipelined_best",
        "danube_pipe_publish_vs_jetstream_pipelined",
        "rate",
    ),
    (
        "danube_consume_ack",
        "danube-client · consume + ack",
        "pull_consume",
        "danube_consume_ack_vs_jetstream_pull_consume",
        "rate",
    ),
    (
        "danube_e2e",
        "danube-client · e2e latency at 1k msg/s",
        "e2e",
        "danube_e2e_p99_vs_jetstream_p99",
        "latency",
    ),
    ("noop_seq_publish", "no-op gRPC server · sequential (ceiling)", None, None, "rate"),
    ("noop_pipe_publish", "no-op gRPC server · 64 in flight (ceiling)", None, None, "rate"),
]

JS_ROWS = [
    ("seq_publish", "seq_publish: awaited js.publish"),
    ("async_publish", "async_publish: publish_async, 4,000 in flight"),
    ("gather_publish", "gather_publish: gather of 1,000 js.publish"),
    ("pull_consume", "pull_consume: fetch(1000), ack each"),
    ("e2e", "latency_push: 1k msg/s, push consumer"),
]


def _num(v: Any, fmt: str = ",.0f") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    return format(v, fmt)


def _ms(lat: dict[str, Any] | None, key: str) -> str:
    if not lat or lat.get(key) is None:
        return "—"
    v = float(lat[key])
    return "—" if math.isnan(v) else f"{v / 1000:,.2f}"


def _js_cell(js: dict[str, Any] | None, key: str | None, kind: str) -> str:
    if not js or key is None:
        return "—"
    if key == "pipelined_best":
        v = js.get("pipelined_best_msgs_per_s")
        return f"{v:,.0f} msg/s" if v else "—"
    case = js.get(key)
    if not case:
        return "—"
    if kind == "latency":
        return f"p99 {_ms(case.get('latency_us'), 'p99')} ms"
    return f"{case['msgs_per_s']:,.0f} msg/s"


def _ratio_cell(v: float | None, kind: str) -> str:
    if v is None:
        return "—"
    return f"p99 {TIMES}{v:.2f}" if kind == "latency" else f"{TIMES}{v:,.2f}"


def _case_row(label: str, case: dict[str, Any]) -> list[str]:
    lat = case.get("latency_us")
    return [
        label,
        _num(case.get("msgs_per_s")),
        _num(case.get("mb_per_s"), ",.2f"),
        _ms(lat, "p50"),
        _ms(lat, "p99"),
        _ms(lat, "p999"),
    ]


def _table(title: str) -> Table:
    t = Table(title=title, title_justify="left")
    t.add_column("case", no_wrap=True)
    for col in ("msgs/s", "MB/s", "p50 ms", "p99 ms", "p99.9 ms"):
        t.add_column(col, justify="right")
    return t


def render(result: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console(width=None if sys.stdout.isatty() else WIDTH)
    cases = result["cases"]
    js = result.get("jetstream")
    rat = result["ratios"]
    opts = result["options"]
    t = _table(
        f"ister bench — fsync {opts['fsync']}, {result['payload_bytes']}-byte payloads, "
        f"started {result['started_at']}"
    )
    t.add_column("JetStream", justify="right")
    t.add_column("Ister / JetStream", justify="right")
    for key, label, js_key, ratio_key, kind in ROWS:
        case = cases.get(key)
        if case is None:
            continue
        ratio = rat.get(ratio_key) if ratio_key else None
        t.add_row(*_case_row(label, case), _js_cell(js, js_key, kind), _ratio_cell(ratio, kind))
    console.print(t)
    if js:
        jt = _table(f"NATS JetStream {js.get('server_version') or ''} sync_always (same run)")
        for key, label in JS_ROWS:
            if key in js:
                jt.add_row(*_case_row(label, js[key]))
        console.print(jt)
    console.print(_details(cases))
    for target in result["targets"]:
        met = target["met"]
        mark = "[green]met[/]" if met else ("[red]not met[/]" if met is False else "[yellow]not measured[/]")
        value = target["value"]
        shown = "—" if value is None else f"{value:,.2f}" if value < 100 else f"{value:,.0f}"
        console.print(f"target: {target['target']}: {shown} → {mark}")
    console.print(
        f"load average {result['loadavg_start']} at start, {result['loadavg_end']} at end; "
        f"{result['host']['cpus']} CPUs; {result['duration_s']:.0f} s"
    )
    shares = [
        f"{phase} {v['busy_pct']:.0f} % busy, {v['steal_pct']:.1f} % stolen"
        for phase, v in (result.get("host_cpu") or {}).items()
        if v
    ]
    if shares:
        console.print("host CPU (all cores) during " + "; ".join(shares))
    for note in result["notes"]:
        console.print(f"note: {note}")


def _details(cases: dict[str, Any]) -> str:
    lines = []
    pub = cases.get("ister_publish")
    if pub:
        lines.append(
            f"batch API publish: {pub['messages']:,} messages, {pub['batch']:,} per send_batch, "
            f"{pub['in_flight']} in flight; latency = {pub['latency_of']}; "
            f"broker CPU {pub['broker_cpu_us_per_msg']:.1f} µs/msg"
        )
    con = cases.get("ister_consume_ack")
    if con:
        lines.append(
            f"batch API consume + ack: {con['messages']:,} messages, window {con['window']:,}; "
            f"unacked afterwards {con['unacked_after']}; broker CPU {con['broker_cpu_us_per_msg']:.1f} µs/msg"
        )
    for key in ("ister_e2e", "danube_e2e"):
        e2e = cases.get(key)
        if e2e:
            rtt = e2e.get("send_rtt_us") or {}
            lines.append(
                f"{key}: received {e2e['received']:,} of {e2e['sent']:,}, late sends {e2e['late_sends']:,}, "
                f"publish ack round trip p50 {_ms(rtt, 'p50')} ms / p99 {_ms(rtt, 'p99')} ms"
            )
    return "\n".join(lines)


def to_json(result: dict[str, Any]) -> str:
    """One JSON object (NaN, which JSON lacks, becomes null)."""

    def clean(v: Any) -> Any:
        if isinstance(v, float) and math.isnan(v):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [clean(x) for x in v]
        return v

    return json.dumps(clean(result), indent=2)
