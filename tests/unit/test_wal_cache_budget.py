"""The shared memory budget of the WALs' record caches (ister.storage.wal.cache.CacheBudget)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from ister.config import load_config
from ister.core.frames import HEADER_SIZE
from ister.errors import ConfigError
from ister.storage.wal import Wal, WalConfig
from ister.storage.wal.cache import CHUNK_OVERHEAD, CacheBudget, RecordCache


def chunk_size(payloads: list[bytes]) -> int:
    return sum(map(len, payloads)) + HEADER_SIZE * len(payloads) + CHUNK_OVERHEAD


def add(cache: RecordCache, payloads: list[bytes]) -> None:
    cache.add(cache.end_offset, payloads, sum(map(len, payloads)))


def test_an_idle_cache_gives_up_its_records_before_a_busy_one() -> None:
    records = [b"x" * 100] * 10
    size = chunk_size(records)
    budget = CacheBudget(3 * size)
    idle, busy = RecordCache(1 << 20, budget), RecordCache(1 << 20, budget)
    add(idle, records)
    add(idle, records)
    add(busy, records)
    assert budget.total == 3 * size == idle.nbytes + busy.nbytes
    add(busy, records)  # one chunk over: the idle cache's oldest goes
    assert (idle.nbytes, busy.nbytes, idle.first_offset) == (size, 2 * size, 10)
    add(busy, records)
    add(busy, records)  # the idle cache is empty now; the busy one drops its own oldest
    assert (idle.nbytes, busy.nbytes, busy.first_offset) == (0, 3 * size, 10)
    assert budget.total == 3 * size
    # what the caches still hold reads back; what left them is "not cached" (readers go to the files)
    assert busy.read(10, 40, 100, 1 << 20) == [(o, b"x" * 100) for o in range(10, 40)]
    assert busy.read(0, 40, 100, 1 << 20) is None


def test_the_newest_chunk_stays_even_when_it_alone_is_over_the_budget() -> None:
    budget = CacheBudget(100)
    cache = RecordCache(1 << 20, budget)
    add(cache, [b"a" * 50])
    add(cache, [b"b" * 500])
    assert cache.read(0, 2, 10, 1 << 20) is None
    assert cache.read(1, 2, 10, 1 << 20) == [(1, b"b" * 500)]
    assert budget.total == cache.nbytes == chunk_size([b"b" * 500])


def test_reset_and_truncate_give_memory_back() -> None:
    budget = CacheBudget(1 << 20)
    cache = RecordCache(1 << 20, budget)
    add(cache, [b"a" * 10, b"b" * 10, b"c" * 10])
    cache.truncate(1)
    assert budget.total == cache.nbytes == chunk_size([b"a" * 10])
    cache.reset(5)
    assert budget.total == cache.nbytes == 0


def test_a_zero_budget_means_no_shared_cap() -> None:
    budget = CacheBudget(0)
    caches = [RecordCache(1 << 20, budget) for _ in range(4)]
    for cache in caches:
        add(cache, [b"x" * 1000] * 10)
    assert budget.total == sum(c.nbytes for c in caches) == 4 * chunk_size([b"x" * 1000] * 10)
    with pytest.raises(ValueError):
        CacheBudget(-1)


@pytest.mark.parametrize("seed", range(200))
def test_random_operations_keep_the_books_and_the_bound(seed: int) -> None:
    """Seeded: adds, truncates, resets and per-cache caps over six caches. The budget always equals the sum
    of what the caches hold, and after an add it is within the limit unless all that is left is one cache's
    newest chunk (the one exception the budget makes)."""
    rng = random.Random(seed)
    budget = CacheBudget(rng.choice([500, 2000, 10_000]))
    caches = [RecordCache(rng.choice([300, 3000, 1 << 20]), budget) for _ in range(6)]
    for _ in range(300):
        cache = rng.choice(caches)
        op = rng.random()
        if op < 0.75:
            payloads = [bytes(rng.randrange(1, 200)) for _ in range(rng.randrange(1, 6))]
            add(cache, payloads)
            holders = [c for c in caches if c.nbytes]
            assert budget.total <= budget.limit or (len(holders) == 1 and holders[0].chunks == 1)
        elif op < 0.9 and cache.end_offset > cache.first_offset:
            cache.truncate(rng.randrange(cache.first_offset, cache.end_offset))
        else:
            cache.reset(cache.end_offset + rng.randrange(3))
        assert budget.total == sum(c.nbytes for c in caches)


async def test_wals_sharing_a_budget_read_everything_back(tmp_path: Path) -> None:
    """Records the budget took out of a WAL's cache are read from its files, in order and whole."""
    budget = CacheBudget(4096)
    config = WalConfig(segment_max_bytes=2048)
    wals = [await Wal.open(tmp_path / f"t{i}", config, cache_budget=budget) for i in range(3)]
    try:
        for round_ in range(20):
            for i, wal in enumerate(wals):
                await wal.append([f"{i}-{round_}-{k}".encode() * 8 for k in range(4)])
        assert budget.total <= 4096
        for i, wal in enumerate(wals):
            reader = wal.reader(0)
            got: list[tuple[int, bytes]] = []
            while len(got) < 80:
                got.extend(await reader.read(max_records=100, timeout=5))
            expected = [f"{i}-{r}-{k}".encode() * 8 for r in range(20) for k in range(4)]
            assert got == list(enumerate(expected))
    finally:
        for wal in wals:
            await wal.close()
    assert budget.total == 0  # a closed WAL's cache holds nothing


def test_the_broker_setting_is_checked() -> None:
    assert load_config(None, None, {}).wal.cache_total_bytes == 256 * 1024 * 1024
    assert load_config(None, None, {"ISTER_WAL__CACHE_TOTAL_BYTES": "0"}).wal.cache_total_bytes == 0
    with pytest.raises(ConfigError, match="cache_total_bytes"):
        load_config(None, None, {"ISTER_WAL__CACHE_TOTAL_BYTES": "-1"})
