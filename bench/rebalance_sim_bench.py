"""Load-manager convergence in the seeded simulation (issue 6): brokers are added to a loaded cluster, and
the leader's pure planner (`ister.core.cluster.rebalance`) moves topics onto them on a fake clock.

usage: python bench/rebalance_sim_bench.py [--topics 90] [--brokers 3] [--add 2] [--json]

The model is the one of tests/sim/test_rebalance_sim.py (reports every 30 s, a move takes 1 to 90 s like an
unload, Fair ranking, equal traffic on every topic). For each aggressiveness level with its preset check
interval and hourly cap (cooldown 60 s, no minimum topic age), from the moment the new brokers join:
simulated time until the cluster settles (no move in flight, every broker reported since the last move,
CV at or under the level's threshold), the number of moves, and the final CV and spread. Not a test.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.sim.test_rebalance_sim import EQUAL_RATE, Sim

from ister.core.cluster.rebalance import LEVELS, RebalanceConfig

LIMIT_SECONDS = 7 * 24 * 3600


@dataclass
class Convergence:
    level: str
    settled: bool
    simulated_seconds: float
    moves: int
    final_cv: float
    cv_threshold: float
    spread: list[int]
    wall_seconds: float


def converge(level: str, topics: int, brokers: int, add: int) -> Convergence:
    config = RebalanceConfig.preset(
        level,  # type: ignore[arg-type]
        enabled=True,
        cooldown_seconds=60,
        min_topic_age_seconds=0,
    )
    sim = Sim(0, "fair", config)
    for _ in range(brokers):
        sim.join()
    for _ in range(topics):
        sim.create()
    for topic in sim.rates:
        sim.rates[topic] = EQUAL_RATE
    start = sim.now
    for _ in range(add):
        sim.join()
    wall = time.perf_counter()
    while not sim.settled() and sim.now - start < LIMIT_SECONDS:
        sim.step(events=False)
    return Convergence(
        level=level,
        settled=sim.settled(),
        simulated_seconds=sim.now - start,
        moves=len(sim.history),
        final_cv=round(sim.balance().cv, 4),
        cv_threshold=config.cv_threshold,
        spread=sorted(len(b.hosted) for b in sim.brokers.values()),
        wall_seconds=round(time.perf_counter() - wall, 2),
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--topics", type=int, default=90)
    ap.add_argument("--brokers", type=int, default=3)
    ap.add_argument("--add", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    results = [converge(level, args.topics, args.brokers, args.add) for level in LEVELS]
    if args.json:
        print(json.dumps([asdict(r) for r in results]))
        return
    for r in results:
        print(
            f"{r.level:>12}: settled={r.settled} after {r.simulated_seconds / 60:.1f} simulated min, "
            f"{r.moves} moves, CV {r.final_cv:.1%} (threshold {r.cv_threshold:.0%}), spread {r.spread}"
        )


if __name__ == "__main__":
    main()
