"""Printing a suite result: rich tables for people, one JSON object for scripts."""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from ister.benchmark import compression_cases

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
    ("noop_consume_ack", "no-op gRPC server · consume + ack, window 10 (ceiling)", None, None, "rate"),
    ("noop_consume_ack_unbounded", "no-op gRPC server · consume + ack, no window", None, None, "rate"),
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
    if result["cases"] or result.get("jetstream"):
        _render_single(result, console)
    if result.get("replication"):
        render_replication(result["replication"], console)
    _render_footer(result, console)


def _render_single(result: dict[str, Any], console: Console) -> None:
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
    _print_targets(result["targets"], console)


def _print_targets(rows: list[dict[str, Any]], console: Console) -> None:
    for target in rows:
        met = target["met"]
        mark = "[green]met[/]" if met else ("[red]not met[/]" if met is False else "[yellow]not measured[/]")
        value = target["value"]
        shown = "—" if value is None else f"{value:,.2f}" if value < 100 else f"{value:,.0f}"
        console.print(f"target: {target['target']}: {shown} → {mark}")


def _render_footer(result: dict[str, Any], console: Console) -> None:
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


# (label, Ister case key, JetStream key, ratio name in replication.COMPARED, kind)
REPLICATION_ROWS = [
    ("batch API · durable publish", "ister_publish", "pipelined_best", "publish", "rate"),
    ("batch API · e2e at 1k msg/s", "ister_e2e", "e2e", "e2e_p99", "latency"),
    (
        "danube-client · publish, sequential",
        "danube_seq_publish",
        "seq_publish",
        "danube_seq_publish",
        "rate",
    ),
    (
        "danube-client · publish, 64 in flight",
        "danube_pipe_publish",
        "pipelined_best",
        "danube_pipe_publish",
        "rate",
    ),
    ("danube-client · e2e at 1k msg/s", "danube_e2e", "e2e", "danube_e2e_p99", "latency"),
]

JS_REPLICATED_ROWS = [
    ("seq_publish", "seq_publish: awaited js.publish"),
    ("async_publish", "async_publish: publish_async, 4,000 in flight"),
    ("gather_publish", "gather_publish: gather of 1,000 js.publish"),
    ("e2e", "e2e: 1k msg/s open loop, push consumer"),
]


def _cell(case: dict[str, Any] | None, kind: str) -> str:
    if not case:
        return "—"
    if kind == "latency":
        lat = case.get("latency_us")
        return f"p50 {_ms(lat, 'p50')} / p99 {_ms(lat, 'p99')} ms"
    return f"{case['msgs_per_s']:,.0f} msg/s"


def _factor_cell(section: dict[str, Any] | None, key: str, kind: str) -> str:
    if section is None:
        return "—"
    if not section.get("available", True):
        return "not available"
    return _cell((section.get("cases") or {}).get(key), kind)


def render_replication(rep: dict[str, Any], console: Console) -> None:
    """The `--cases replicated` part: Ister RF 1 / RF 3 and JetStream R1 / R3 side by side, ratios."""
    ister, js, rat = rep["ister"], rep["jetstream"], rep["ratios"]
    rf1, rf3 = ister.get("rf1"), ister.get("rf3")
    opts = rep["options"]
    t = Table(
        title=f"ister bench — replication: {opts['brokers']} brokers (one etcd), fsync {opts['fsync']}; "
        "NATS JetStream sync_interval always",
        title_justify="left",
    )
    t.add_column("case", no_wrap=True)
    for col in ("Ister RF 1", "Ister RF 3", "RF 3 / RF 1", "JetStream R1", "JetStream R3", "RF 3 / JS R3"):
        t.add_column(col, justify="right")
    for label, key, js_key, name, kind in REPLICATION_ROWS:
        if not any((s or {}).get("cases", {}).get(key) for s in (rf1, rf3)):
            continue
        t.add_row(
            label,
            _factor_cell(rf1, key, kind),
            _factor_cell(rf3, key, kind),
            _ratio_cell(rat.get(f"rf3_vs_rf1_{name}"), kind),
            _js_cell(js.get("r1"), js_key, kind),
            _js_cell(js.get("r3"), js_key, kind),
            _ratio_cell(rat.get(f"rf3_vs_jetstream_r3_{name}"), kind),
        )
    console.print(t)
    for rf_key, section in sorted(ister.items()):
        if not section.get("available", True):
            console.print(f"Ister {rf_key.upper()}: {section.get('reason')}")
            continue
        it = _table(f"Ister cluster {rf_key.upper()} (config {section.get('config') or '{}'})")
        for label, key, _, _, _ in REPLICATION_ROWS:
            case = section["cases"].get(key)
            if case:
                it.add_row(*_case_row(label, case))
        console.print(it)
        owners = section.get("owners") or {}
        if owners:
            console.print("topic owners (lookup): " + ", ".join(f"{t} → {u}" for t, u in owners.items()))
        console.print(_details(section["cases"]))
    for _, section in sorted(js.items()):
        jt = _table(
            f"NATS JetStream {section.get('server_version') or ''}, {section['nodes']} node(s), "
            f"R{section['replicas']}, sync_interval always (same run)"
        )
        for key, label in JS_REPLICATED_ROWS:
            if key in section:
                jt.add_row(*_case_row(label, section[key]))
        console.print(jt)
    r = rat.get("jetstream_r3_vs_r1_publish")
    if r is not None:
        console.print(f"JetStream R3 / R1 pipelined publish: {TIMES}{r:.2f}")
    _print_targets(rep["targets"], console)
    shares = [
        f"{phase} {v['busy_pct']:.0f} % busy, {v['steal_pct']:.1f} % stolen"
        for phase, v in (rep.get("host_cpu") or {}).items()
        if v
    ]
    if shares:
        console.print("host CPU (all cores) during " + "; ".join(shares))
    for note in rep["notes"]:
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
    idem = cases.get("ister_idempotence")
    if idem:
        off, on = idem["off_msgs_per_s"], idem["on_msgs_per_s"]
        cpu_off, cpu_on = idem["off_broker_cpu_us_per_msg"], idem["on_broker_cpu_us_per_msg"]
        lines.append(
            f"batch API publish, idempotence off vs on ({idem['rounds']} runs each, medians): "
            f"{off:,.0f} vs {on:,.0f} msg/s, cost {idem['cost_pct']:.1f} %; "
            f"broker CPU {cpu_off:.2f} vs {cpu_on:.2f} µs/msg"
        )
    comp = cases.get("ister_compression")
    if comp:
        lines.append(compression_cases.render(comp))
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
