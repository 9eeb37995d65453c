"""Where the broker's time goes during one batch-API case of `ister bench`. Not a test.

usage: python bench/profile_broker.py --case publish|consume|latency [--py-spy PATH] [--seconds 6]
                                      [--messages 3000000] [--delay 2] [--raw out.txt] [--perf] [--json]

Runs `ister bench --cases <case> --no-nats --no-danube`, attaches to the broker subprocess it starts and, for
`--seconds` while the case runs, records (1) the CPU seconds of every broker thread from /proc (named by
py-spy's thread dump: MainThread = the event loop, wal-writer:*, the gRPC poller, ...) and (2) a py-spy
profile (`record --nonblocking --threads -f raw`) of the event-loop thread, whose samples are put into
buckets by the innermost frame that names a part of Ister (or prometheus_client / asyncio). Samples whose
innermost Python frame is the event loop itself are time in C: grpc's Cython/C-core, uvloop, and the kernel
under them; `--perf` splits the loop thread's time by shared object with `perf record` (kernel,
libpython, grpc's cygrpc, uvloop, ...). For `consume`, the publish phase (not profiled) runs first;
`--delay` counts from the consume phase's start. py-spy is not a dependency: install it anywhere, e.g.
    python3 -m venv /tmp/pyspy && /tmp/pyspy/bin/pip install py-spy
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

BUCKETS = [  # (bucket, regex on a frame "function (file:line)"), first match from the innermost frame wins
    ("prometheus_client metrics", r"\(prometheus_client/"),
    (
        "batch decode + validation (msgspec)",
        r"^(decode_batch\S* \(ister/server/|(_decode|decode_published\S*|check_attributes) \(ister/core/)",
    ),
    ("consume framing + crc32c (_next_frame)", r"^_next_frame \(ister/server/"),
    ("ack handling (SubAcks, ack_range)", r"^(SubAcks\.|IsterServicer\._consume_reader)"),
    ("WAL framing + crc32c (encode_frames)", r"\(ister/core/frames\.py"),
    ("WAL append / commit / cache / reader", r"\(ister/storage/"),
    ("dispatch state machine (core/dispatch)", r"\(ister/core/dispatch/"),
    ("subscription driver (broker/reliable.py)", r"\(ister/broker/(reliable|subscription|sessions)\.py"),
    ("topic + broker service", r"\(ister/broker/"),
    ("metadata store (cursor writes)", r"\(ister/metadata/"),
    ("publish / consume servicer code", r"\(ister/server/"),
    ("asyncio in Python (queues, tasks, timeouts)", r"\(asyncio/|\(_weakrefset"),
]
C_LEVEL = "gRPC + uvloop in C/Cython (no Python frame)"


def bucket_of(frames: list[str]) -> str:
    for frame in reversed(frames):
        if frame.startswith(("Runner.run (asyncio/runners.py", "run (uvloop/")):
            return C_LEVEL
        for name, pattern in BUCKETS:
            if re.search(pattern, frame):
                return name
    return "other"


def _label(name: str | None) -> str:
    if name is None:
        return "gRPC C-core threads (event engine, timers)"
    for prefix, label in (
        ("MainThread", "event loop (MainThread)"),
        ("wal-writer", "WAL writer thread(s)"),
        ("Thread-1 (_poll_wrapper)", "gRPC aio poller thread"),
        ("uvloop", "executor threads"),
    ):
        if name.startswith(prefix):
            return label
    return "other Python threads (Prometheus exporter, ...)"


def thread_cpu(pid: int) -> dict[int, float]:
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
        except (OSError, ValueError):
            pass
    return out


def thread_names(py_spy: str, pid: int) -> dict[int, str]:
    for _ in range(5):
        done = subprocess.run([py_spy, "dump", "-p", str(pid)], capture_output=True, text=True, timeout=30)
        found = re.finditer(r'Thread (\d+) \([\w+]+\): "([^"]+)"', done.stdout)
        names = {int(m.group(1)): m.group(2) for m in found}
        if names:
            return names
        print(f"py-spy dump: {done.stderr.strip()[:300]}", file=sys.stderr)
        time.sleep(0.2)
    return {}


def summarize(raw: str, loop_tid: int) -> tuple[int, collections.Counter[str]]:
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        if not frames or not frames[0].startswith(f"thread ({loop_tid})"):
            continue
        total += int(n)
        counts[bucket_of(frames[1:])] += int(n)
    return total, counts


def other_threads(raw: str, loop_tid: int, names: dict[int, str]) -> dict[str, collections.Counter[str]]:
    """Innermost Ister frame (or the innermost frame) of every other thread's samples, by thread label."""
    out: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        m = re.match(r"thread \((\d+)\)", frames[0]) if frames else None
        if m is None or int(m.group(1)) == loop_tid:
            continue
        inner = next((f for f in reversed(frames[1:]) if "(ister/" in f), frames[-1])
        out[_label(names.get(int(m.group(1))))][re.sub(r":\d+\)$", ")", inner)] += int(n)
    return out


def perf_dsos(data: Path) -> dict[str, float]:
    """`perf report --sort dso` of a recording: percent of samples per shared object (kernel included)."""
    done = subprocess.run(
        ["perf", "report", "-i", str(data), "--sort", "dso", "--stdio", "-g", "none"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = {}
    for line in done.stdout.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(\S+)", line)
        if m:
            out[m.group(2)] = float(m.group(1))
    if not out:
        print(f"perf report gave nothing: {done.stderr.strip()[-500:]}", file=sys.stderr)
    return out


def wait_for_case(stderr: Any, case: str) -> int:
    """Read `ister bench`'s progress until it names the broker's pid and starts `case`; the pid."""
    pid = 0
    marker = "batch API: consume" if case == "consume" else "batch API:"
    for line in stderr:
        if m := re.search(r"broker pid (\d+)", line):
            pid = int(m.group(1))
        if pid and marker in line:
            break
    if not pid:
        raise SystemExit("no broker pid in the bench output")
    return pid


def print_report(
    report: dict[str, Any], result: dict[str, Any], pid: int, wall: float, total: int, dsos: dict[str, float]
) -> None:
    """The human-readable form of `report` (--json prints the report itself)."""
    figures = ", ".join(
        f"{k} {v['msgs_per_s']:,.0f} msg/s, broker CPU {v.get('broker_cpu_us_per_msg', 0):.1f} us/msg"
        for k, v in result["cases"].items()
    )
    print(f"case {report['case']}: {figures}")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"broker pid {pid}, {wall:.1f} s profiled, load average {load} at the end")
    print("broker threads, % of one core:")
    for name, pct in report["thread_cpu_pct"].items():
        if pct >= 0.5:
            print(f"  {pct:6.1f} %  {name}")
    print(f"event-loop thread, {total} py-spy samples:")
    for name, pct in report["loop_buckets_pct"].items():
        print(f"  {pct:6.1f} %  {name}")
    for label, frames in report["other_threads_samples"].items():
        print(
            f"{label}, py-spy samples by innermost Ister frame: "
            + "; ".join(f"{f} {n}" for f, n in frames.items())
        )
    if dsos:
        print("event-loop thread, perf samples by shared object (C and kernel included):")
        for dso, pct in dsos.items():
            if pct >= 0.5:
                print(f"  {pct:6.1f} %  {dso}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", required=True, choices=["publish", "consume", "latency"])
    ap.add_argument("--py-spy", default="py-spy")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--delay", type=float, default=2.0)
    ap.add_argument("--messages", type=int, default=3_000_000)
    ap.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    ap.add_argument("--raw", type=Path, help="keep py-spy's raw output here")
    ap.add_argument("--perf", action="store_true", help="also split the loop thread by shared object (perf)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    cmd = [
        sys.executable,
        "-m",
        "ister.cli",
        "bench",
        "--no-nats",
        "--no-danube",
        "--json",
        "--cases",
        args.case,
        "--messages",
        str(args.messages),
    ]
    bench = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert bench.stderr is not None and bench.stdout is not None
    pid = wait_for_case(bench.stderr, args.case)
    stderr_rest: list[str] = []
    threading.Thread(target=lambda: stderr_rest.extend(bench.stderr or []), daemon=True).start()
    time.sleep(args.delay)
    names = thread_names(args.py_spy, pid)
    raw_path = args.raw or Path(tempfile.mkstemp(prefix="ister-profile-", suffix=".txt")[1])
    loop_tid = next((t for t, n in names.items() if n == "MainThread"), pid)
    perf_data = Path(tempfile.mkstemp(prefix="ister-perf-", suffix=".data")[1])
    perf = None
    if args.perf:
        perf_cmd = ["perf", "record", "-F", "999", "-t", str(loop_tid), "-o", str(perf_data)]
        perf = subprocess.Popen([*perf_cmd, "--", "sleep", str(args.seconds)], stdout=subprocess.DEVNULL)
    before = thread_cpu(pid)
    t0 = time.monotonic()
    subprocess.run(
        [
            args.py_spy,
            "record",
            "-p",
            str(pid),
            "-d",
            str(int(args.seconds)),
            "-r",
            str(args.rate),
            "--nonblocking",
            "--threads",
            "-f",
            "raw",
            "-o",
            str(raw_path),
        ],
        check=True,
        capture_output=True,
    )
    wall = time.monotonic() - t0
    after = thread_cpu(pid)
    names.update(thread_names(args.py_spy, pid))  # threads started meanwhile (executor workers)
    out_text, _ = bench.communicate(timeout=900)
    result = json.loads(out_text)
    threads = collections.Counter[str]()
    for tid, cpu in after.items():
        threads[_label(names.get(tid))] += cpu - before.get(tid, 0.0)
    total, buckets = summarize(raw_path.read_text(), loop_tid)
    others = other_threads(raw_path.read_text(), loop_tid, names)
    if args.raw is None:
        raw_path.unlink(missing_ok=True)
    dsos: dict[str, float] = {}
    if perf is not None:
        perf.wait(60)
        dsos = perf_dsos(perf_data)
    perf_data.unlink(missing_ok=True)
    report = {
        "case": args.case,
        "result": result["cases"],
        "profiled_seconds": wall,
        "thread_cpu_pct": {k: 100 * v / wall for k, v in threads.most_common()},
        "loop_samples": total,
        "loop_buckets_pct": {k: 100 * v / total for k, v in buckets.most_common()} if total else {},
        "other_threads_samples": {k: dict(v.most_common(5)) for k, v in others.items()},
        "loop_perf_dso_pct": dsos,
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print_report(report, result, pid, wall, total, dsos)


if __name__ == "__main__":
    main()
