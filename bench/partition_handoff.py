"""Partition handoff figures (issue 19), real processes: splits, duplicates, pauses, delivery gaps, spread.

usage: python bench/partition_handoff.py [--runs 3] [--ack-delay 0.25] [--tick 0.025] [--max-handoff 3]
       [--rebalance-delay 0.3] [--json]

Runs the scenario of tests/integration/test_partition_handoff_e2e.py (tests/integration/partition_scenario.py)
against a fresh `ister broker` per run: a topic with 6 partitions, 12 keys each sending a numbered sequence
(one message of every key per tick), consumers of the official client (Failover) and of the Ister client
(`partitioned`), each its own process acknowledging every message `--ack-delay` after it arrived, joining
one by one (c1 danube, c2 ister, c3 danube, c4 ister), then c2 leaving cleanly, c3 SIGKILLed, c1 leaving
cleanly. Per step: partitions per consumer once settled, the partitions moved, the broker's longest handoff
pause, the moving partitions' delivery gap around the switch as the consumers saw it, the largest delivery
gap of the partitions that did not move while the handoffs were in progress (and how many messages they
delivered meanwhile), key sequences split, messages redelivered.

Brokers and consumers run this checkout's code (src/ and the repository root go first on PYTHONPATH).
Not a test: timings depend on the machine and its load. Results go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(ROOT / "src"), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
)

from tests.integration.harness import BrokerProcess  # noqa: E402
from tests.integration.partition_scenario import Figures, Scenario, Settings, analyse, report  # noqa: E402

from ister.benchmark.stats import host_cpu_share, host_cpu_ticks  # noqa: E402

DEFAULTS = Settings()


async def one_run(settings: Settings, i: int) -> Figures:
    tmp = Path(tempfile.mkdtemp(prefix="ister-handoff-"))
    broker = BrokerProcess(tmp / "data")
    broker.start()
    try:
        run = await Scenario(
            broker.url, broker.admin_addr, broker.log_path, f"/default/handoff{i}", settings
        ).run()
    finally:
        broker.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return analyse(run)


def summary(figs: list[Figures]) -> str:
    def med(values: list[float], digits: int = 0) -> str:
        m, lo, hi = (round(v * 1000, digits) for v in (statistics.median(values), min(values), max(values)))
        return f"{m:g} ({lo:g}-{hi:g})"

    lines = [
        f"{len(figs)} runs: sent {sum(f.sent for f in figs)}, missing {sum(len(f.missing) for f in figs)}, "
        f"duplicates {[f.duplicates for f in figs]} (first received by "
        f"{sorted({c for f in figs for c in f.duplicate_first_receivers})}), "
        f"order violations {sum(len(f.order_violations) for f in figs)}, "
        f"splits {[len(f.splits) for f in figs]} "
        f"({sum(not s.explained for f in figs for s in f.splits)} not at a handoff of the key's partition)",
        f"delivery gap of a partition away from handoffs, p50/p99 ms: "
        f"{med([f.baseline_gap_p50 for f in figs], 1)} / {med([f.baseline_gap_p99 for f in figs], 1)}",
        "median (min-max) over the runs, ms:",
        f"{'step':<20} {'spread':>6} {'moved':>5} {'pause':>14} {'moving gap':>14} {'still gap':>14} "
        f"{'still msgs':>10} {'splits':>6} {'redelivered':>11}",
    ]
    for n, s in enumerate(figs[0].steps):
        col = [f.steps[n] for f in figs]
        still_n = statistics.median([c.still_deliveries for c in col])
        splits = statistics.median([c.splits for c in col])
        redelivered = statistics.median([c.redelivered for c in col])
        lines.append(
            f"{s.label:<20} {max(c.spread for c in col):>6} {len(s.moved):>5} "
            f"{med([c.max_pause for c in col]):>14} {med([c.moving_gap for c in col]):>14} "
            f"{med([c.still_gap for c in col]):>14} {still_n:>10.0f} {splits:>6.0f} {redelivered:>11.0f}"
        )
    return "\n".join(lines)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ack-delay", type=float, default=DEFAULTS.ack_delay)
    parser.add_argument("--tick", type=float, default=DEFAULTS.tick)
    parser.add_argument("--max-handoff", type=float, default=DEFAULTS.max_handoff)
    parser.add_argument("--rebalance-delay", type=float, default=DEFAULTS.rebalance_delay)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    settings = Settings(
        ack_delay=args.ack_delay,
        tick=args.tick,
        max_handoff=args.max_handoff,
        rebalance_delay=args.rebalance_delay,
    )
    ticks = host_cpu_ticks()
    figs = []
    for i in range(args.runs):
        fig = await one_run(settings, i)
        figs.append(fig)
        if not args.json:
            print(f"-- run {i + 1}\n{report(fig)}", flush=True)
    load = {"loadavg": os.getloadavg(), **host_cpu_share(ticks, host_cpu_ticks())}
    if args.json:
        print(
            json.dumps({"settings": vars(args), "load": load, "runs": [f.as_dict() for f in figs]}, indent=1)
        )
    else:
        print(f"-- {summary(figs)}\nload: {load}")


if __name__ == "__main__":
    asyncio.run(main())
