"""broker/heap.py: long-lived objects are frozen out of the cyclic collector; a sweep after many unloads."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from ister.broker.heap import FREEZE_AFTER_TOPICS, SWEEP_AFTER_UNLOADS, HeapKeeper


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()  # give the test process its collector back


def test_long_lived_objects_are_frozen_after_many_topic_loads() -> None:
    counts = [0, 0]
    keeper = HeapKeeper(lambda: (counts[0], counts[1]))
    kept = [[i] for i in range(50_000)]  # long-lived objects, as loaded topics make
    gc.collect()
    frozen = gc.get_freeze_count()
    counts[0] = FREEZE_AFTER_TOPICS - 1
    keeper.step()
    assert keeper.freezes == 0 and gc.get_freeze_count() == frozen  # not yet: nothing is even looked at
    counts[0] = FREEZE_AFTER_TOPICS
    keeper.step()
    assert keeper.freezes == 1
    assert gc.get_freeze_count() >= frozen + len(kept)  # full collections no longer walk them
    keeper.step()  # no more topics since: nothing to do
    assert keeper.freezes == 1


def test_a_full_sweep_after_many_unloads_collects_frozen_cycles() -> None:
    counts = [10, 0]
    keeper = HeapKeeper(lambda: (counts[0], counts[1]))

    class Node:
        pass

    node = Node()
    node.self = node  # type: ignore[attr-defined]  # a reference cycle
    alive = weakref.ref(node)
    gc.freeze()
    del node  # garbage now, but frozen: no collection looks at it
    gc.collect()
    assert alive() is not None
    counts[1] = SWEEP_AFTER_UNLOADS - 1
    keeper.step()
    assert keeper.sweeps == 0 and alive() is not None
    counts[1] = SWEEP_AFTER_UNLOADS
    keeper.step()
    assert keeper.sweeps == 1
    assert alive() is None
