import random

from ister.core.missing_offsets import GapLedger


def test_each_missing_offset_is_new_once() -> None:
    ledger = GapLedger()
    assert ledger.add(10, 20) == [(10, 20)]
    assert ledger.add(10, 20) == []
    assert ledger.add(15, 30) == [(20, 30)]
    assert ledger.add(0, 5) == [(0, 5)]
    assert ledger.add(0, 40) == [(5, 10), (30, 40)]
    assert ledger.ranges() == [(0, 40)]
    assert ledger.add(7, 7) == []


def test_random_reports_match_a_set_model() -> None:
    for seed in range(200):
        rng = random.Random(seed)
        ledger = GapLedger()
        seen: set[int] = set()
        for _ in range(50):
            a = rng.randrange(0, 200)
            b = a + rng.randrange(0, 30)
            new = ledger.add(a, b)
            fresh = {o for x, y in new for o in range(x, y)}
            assert fresh == set(range(a, b)) - seen, f"seed {seed}"
            assert sum(y - x for x, y in new) == len(fresh), f"seed {seed}"
            seen |= fresh
        assert {o for x, y in ledger.ranges() for o in range(x, y)} == seen, f"seed {seed}"
        starts = [x for x, _ in ledger.ranges()]
        assert starts == sorted(starts)
