"""broker/heap.py: long-lived objects are frozen out of the cyclic collector; a sweep after many unloads."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from ister.broker.heap import (
    FREEZE_AFTER,
    MIDDLE_THRESHOLD,
    SWEEP_AFTER_UNLOADS,
    YOUNG_THRESHOLD,
    HeapKeeper,
)


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
    counts[0] = FREEZE_AFTER - 1
    keeper.step()
    assert keeper.freezes == 0 and gc.get_freeze_count() == frozen  # not yet: nothing is even looked at
    counts[0] = FREEZE_AFTER
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


async def test_middle_generation_collections_stay_small_while_long_lived_objects_pile_up() -> None:
    """Counts are net, so objects that live on fill the young generations up to their thresholds: a middle
    collection walks the youngest generation (at most YOUNG + 1 objects) and the survivors of the young
    collections since the last middle one (at most YOUNG + 1 each): at most about YOUNG x (MIDDLE + 2).
    (Counted with gc.get_count(): gc.get_objects() inside a collector callback is not safe beside other
    threads.)"""
    keeper = HeapKeeper(lambda: (0, 0))
    task = asyncio.get_running_loop().create_task(keeper.run())
    folded: list[int] = []  # young collections whose survivors each middle collection walks

    def measure(phase: str, info: dict[str, Any]) -> None:
        if phase == "start" and info["generation"] == 1:
            folded.append(gc.get_count()[1])

    saved = gc.get_threshold()
    try:
        await asyncio.sleep(0)  # thresholds set, start-up frozen
        gc.callbacks.append(measure)
        kept = [[i] for i in range(400_000)]  # long-lived, with no growth event: nothing is frozen
        gc.callbacks.remove(measure)
        assert len(kept) == 400_000
        assert len(folded) >= 400_000 // (YOUNG_THRESHOLD * (MIDDLE_THRESHOLD + 2)) - 1
        walked_at_most = (max(folded) + 1) * (YOUNG_THRESHOLD + 1)
        assert walked_at_most <= 50_000  # a few tens of ms on a slow machine (~290,000 with 20: 0.2 s)
    finally:
        if measure in gc.callbacks:
            gc.callbacks.remove(measure)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        gc.set_threshold(*saved)
