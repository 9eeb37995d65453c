"""Percentiles and the small records every case returns."""

from __future__ import annotations

import math
import os
import time
from typing import Any

PAYLOAD_BYTES = 100
PAYLOAD = b"p" * PAYLOAD_BYTES
STAMP_DIGITS = 20  # a CLOCK_MONOTONIC nanosecond stamp, zero-padded, at the start of a latency payload
WARMUP_LATENCY_SAMPLES = 100  # dropped from every latency series


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100), as ../shared/peers/common.py computes it; NaN when empty."""
    s = sorted(values)
    if not s:
        return math.nan
    k = max(0, min(len(s) - 1, round(p / 100.0 * len(s) + 0.5) - 1))
    return s[k]


def latency_us(samples_s: list[float]) -> dict[str, float]:
    """p50 / p99 / p99.9 / max in microseconds of latencies given in seconds."""
    us = sorted(x * 1e6 for x in samples_s)
    return {
        "p50": pct(us, 50),
        "p99": pct(us, 99),
        "p999": pct(us, 99.9),
        "max": us[-1] if us else math.nan,
        "samples": len(us),
    }


def stamped_payload() -> bytes:
    return str(time.monotonic_ns()).zfill(STAMP_DIGITS).encode() + PAYLOAD[STAMP_DIGITS:]


def stamp_age_s(payload: bytes, now_ns: int) -> float:
    return (now_ns - int(payload[:STAMP_DIGITS])) / 1e9


def rate(messages: int, seconds: float, payload_bytes: int = PAYLOAD_BYTES) -> dict[str, Any]:
    per_s = messages / seconds if seconds > 0 else 0.0
    return {
        "messages": messages,
        "seconds": seconds,
        "msgs_per_s": per_s,
        "mb_per_s": per_s * payload_bytes / 1e6,
    }


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (0.0 when it cannot be read)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def thread_stats(pid: int) -> dict[int, tuple[str, float, int]]:
    """Per thread of a process: thread id -> (name, user + system CPU seconds, voluntary context switches)
    so far. Threads that end while being read are left out."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, tuple[str, float, int]] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                status = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        switches = int(status.split("voluntary_ctxt_switches:")[1].split()[0])
        out[int(tid)] = (name, (int(fields[11]) + int(fields[12])) / tick, switches)
    return out


def thread_deltas(
    before: dict[int, tuple[str, float, int]], after: dict[int, tuple[str, float, int]]
) -> list[tuple[int, str, float, int]]:
    """(thread id, name, CPU seconds, voluntary context switches) spent by each thread between two
    `thread_stats` readings (a thread started in between counts from zero)."""
    out = []
    for tid, (name, cpu, switches) in after.items():
        _, cpu0, switches0 = before.get(tid, (name, 0.0, 0))
        out.append((tid, name, cpu - cpu0, switches - switches0))
    return out


def host_cpu_ticks() -> list[int]:
    """The aggregate `cpu` line of /proc/stat (user nice system idle iowait irq softirq steal ...)."""
    try:
        with open("/proc/stat") as f:
            return [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return []


def host_cpu_share(before: list[int], after: list[int]) -> dict[str, float]:
    """Busy and steal shares (percent of all CPU time of the machine) between two host_cpu_ticks()."""
    if len(before) < 8 or len(after) < 8:
        return {}
    d = [b - a for a, b in zip(before, after, strict=False)]
    total = sum(d[:8]) or 1
    idle = d[3] + d[4]
    return {"busy_pct": 100.0 * (total - idle - d[7]) / total, "steal_pct": 100.0 * d[7] / total}


def stop_child(proc: Any) -> None:
    """Join a benchmark child process, killing it if it does not end by itself."""
    proc.join(10)
    if proc.is_alive():
        proc.kill()
        proc.join(5)


def latency_result(
    n: int, wall: float, lats: list[float], rtts: list[float], late: int, **extra: Any
) -> dict[str, Any]:
    """The e2e-latency case's result: rate, send->receive latency and send round trips (warm-up dropped)."""
    out = rate(n, wall)
    out.update(
        latency_us=latency_us(lats[WARMUP_LATENCY_SAMPLES:]),
        latency_of="send -> receive in another process",
        sent=n,
        received=len(lats),
        late_sends=late,
        send_rtt_us=latency_us(rtts[WARMUP_LATENCY_SAMPLES:]),
        **extra,
    )
    return out
