"""A cluster's brokers as one group: built with the same cluster arguments, started together (all
launched, then each waited for until it listens), stopped together. `ister dev` (dev.py) and the tests'
`Cluster` (tests/integration/cluster.py) start cluster brokers with it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Generic, TypeVar

from ister.devcluster.broker import BrokerNode

N = TypeVar("N", bound=BrokerNode)


def cluster_args(etcd_endpoints: Sequence[str], cluster_name: str, *extra: str) -> list[str]:
    """What makes `ister broker` a member of a cluster (after the addresses)."""
    return [
        "--mode",
        "cluster",
        "--etcd-endpoints",
        ",".join(etcd_endpoints),
        "--cluster-name",
        cluster_name,
        *extra,
    ]


class BrokerGroup(Generic[N]):
    """`size` brokers made by `make(i)`; `start(count)` starts the first `count`, `start_more()` the rest."""

    def __init__(self, size: int, make: Callable[[int], N]) -> None:
        self.brokers: list[N] = [make(i) for i in range(size)]
        self.started = 0

    def start(self, count: int | None = None) -> None:
        self.started = len(self.brokers) if count is None else count
        self._start(self.brokers[: self.started])

    def start_more(self) -> None:
        more = self.brokers[self.started :]
        self.started = len(self.brokers)
        self._start(more)

    @staticmethod
    def _start(brokers: Sequence[N]) -> None:
        for b in brokers:
            b.launch()
        for b in brokers:
            b.wait_listening()

    def stop(self) -> None:
        for b in self.brokers:
            b.stop()

    def data_dirs(self) -> list[Path]:
        return [b.data_dir for b in self.brokers]
