"""The danube-client part of `ister bench` (for old scripts): danube-client cases, no-op ceiling, JetStream.

usage: python bench/danube_bench.py [--fsync always|interval] [--n-seq 3000] [--n-pipe 20000]
                                    [--nats-script ../shared/peers/nats_bench.py] [--no-nats] [--json]

Same as `ister bench` without the batch-API cases; see `ister.benchmark.danube_cases` for the workloads and
docs/benchmarks.md for the method. Not a test: numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ister.benchmark import nats, report, suite


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fsync", default="always", choices=["always", "interval"])
    ap.add_argument("--n-seq", type=int, default=3000)
    ap.add_argument("--n-pipe", type=int, default=20000)
    ap.add_argument("--nats-script", type=Path, default=nats.default_script())
    ap.add_argument("--no-nats", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    opts = suite.Options(
        fsync=args.fsync,
        cases=frozenset(),
        danube_seq=args.n_seq,
        danube_pipe=args.n_pipe,
        nats=not args.no_nats,
        nats_script=args.nats_script,
        nats_seq=args.n_seq,
        nats_pipe=args.n_pipe,
    )
    result = suite.run(opts, lambda msg: print(f"danube_bench: {msg}", file=sys.stderr, flush=True))
    if args.json:
        print(report.to_json(result))
    else:
        report.render(result)


if __name__ == "__main__":
    main()
