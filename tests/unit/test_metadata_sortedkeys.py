"""SortedKeys (the embedded store's key index) against a sorted list, over random inserts and deletes."""

from __future__ import annotations

import bisect
import random

import pytest

from ister.metadata import sortedkeys
from ister.metadata.sortedkeys import SortedKeys


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sortedkeys, "CHUNK", 4)  # splits and emptied chunks happen within a few keys


def _from(model: list[str], key: str, inclusive: bool) -> list[str]:
    return model[(bisect.bisect_left if inclusive else bisect.bisect_right)(model, key) :]


@pytest.mark.parametrize("seed", range(20))
def test_matches_a_sorted_list(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = "abcd/"
    initial = {"".join(rng.choices(alphabet, k=rng.randint(1, 5))) for _ in range(rng.randint(0, 30))}
    keys = SortedKeys(initial)
    model = sorted(initial)
    for _ in range(400):
        key = "".join(rng.choices(alphabet, k=rng.randint(1, 5)))
        if rng.random() < 0.55:
            if key not in model:
                keys.add(key)
                bisect.insort(model, key)
        else:
            assert keys.discard(key) == (key in model)
            if key in model:
                model.remove(key)
        assert len(keys) == len(model)
        probe = "".join(rng.choices(alphabet, k=rng.randint(0, 4)))
        assert list(keys.iter_from(probe)) == _from(model, probe, True)
        assert list(keys.iter_from(probe, inclusive=False)) == _from(model, probe, False)
    assert list(keys) == model


def test_empty() -> None:
    keys = SortedKeys()
    assert list(keys.iter_from("")) == []
    assert not keys.discard("a")
    keys.add("b")
    assert list(keys.iter_from("a")) == ["b"]
    assert list(keys.iter_from("b", inclusive=False)) == []
    assert keys.discard("b") and len(keys) == 0 and list(keys) == []
