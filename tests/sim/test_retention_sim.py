"""Seeded simulation of retention over thousands of random topics and clocks (core/retention.py).

Each seed grows a topic's log unit by unit (random sizes, publish times moving forward with jitter),
moves what is exported/committed (`safe_end`) forward at random, changes the limits at random, and runs a
pass at random times, applying its plan as the broker does (start offset first, then the units). After
every pass it checks: nothing at or past `safe_end` was deleted; every deleted unit was past the time limit
or its deletion left at least the size limit; only a prefix was ever deleted (no unit kept below a deleted
one); the start offset never went back and equals the end of the last deleted unit; and a unit that was
past every limit when the pass ran, with only deletable units before it, was deleted. A failure names the
seed.
"""

from __future__ import annotations

import random

import pytest

from ister.core.retention import RetentionLimits, Unit, plan

SEEDS = 2_000
STEPS = 80


def run(seed: int) -> None:
    rng = random.Random(seed)
    now = rng.randint(0, 10**6)
    live: list[Unit] = []
    deleted: list[Unit] = []
    next_offset = 0
    safe_end = 0
    start = 0
    for _ in range(STEPS):
        roll = rng.random()
        if roll < 0.45:  # a new unit
            count = rng.randint(1, 50)
            newest = now - rng.randint(0, 2_000)
            live.append(Unit(next_offset, next_offset + count, rng.randint(1, 1_000), newest))
            next_offset += count
        elif roll < 0.6:  # more exported/committed
            safe_end = rng.randint(safe_end, next_offset)
        elif roll < 0.75:
            now += rng.randint(0, 5_000)
        else:
            limits = RetentionLimits(
                time_ms=rng.choice([0, 1, 500, 3_000, 20_000]), size_bytes=rng.choice([0, 1, 800, 3_000])
            )
            before = list(live)
            new_start, gone = plan(live, limits, now, safe_end, start)
            assert new_start >= start, f"seed {seed}: start went back {start} -> {new_start}"
            assert gone == before[: len(gone)], f"seed {seed}: not a prefix"
            remaining = sum(u.size for u in before)
            for u in gone:
                assert u.end <= safe_end, f"seed {seed}: deleted {u} past safe_end {safe_end}"
                by_time = limits.time_ms > 0 and u.newest_ms < now - limits.time_ms
                by_size = limits.size_bytes > 0 and remaining - u.size >= limits.size_bytes
                assert by_time or by_size or u.end <= start, f"seed {seed}: {u} deleted within every limit"
                remaining -= u.size
            if gone:
                assert new_start == max(start, gone[-1].end), f"seed {seed}: start {new_start} vs {gone[-1]}"
            if len(gone) < len(before):  # the first kept unit had a reason to stay
                u = before[len(gone)]
                by_time = limits.time_ms > 0 and u.newest_ms < now - limits.time_ms
                by_size = limits.size_bytes > 0 and remaining - u.size >= limits.size_bytes
                assert u.end > safe_end or not (by_time or by_size), f"seed {seed}: {u} should have gone"
            start = new_start
            deleted += gone
            live = before[len(gone) :]
        for u in deleted:
            assert u.end <= start, f"seed {seed}: deleted {u} not below the start {start}"


@pytest.mark.parametrize("chunk", range(4))
def test_retention_simulation(chunk: int) -> None:
    for seed in range(chunk * SEEDS // 4, (chunk + 1) * SEEDS // 4):
        run(seed)
