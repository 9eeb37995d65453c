"""An Ister cluster for the benchmark: one etcd and N `ister broker --mode cluster` processes on loopback.

`BenchCluster(replication_factor=3)` writes the replication settings into a YAML config file every broker
reads (`cluster.replication_factor`, `cluster.min_insync_replicas`). Environment variables cannot carry
them: an ISTER_* variable naming no setting is ignored with a warning (ister.config), so a broker without
replication would silently run RF 1; a config file key naming no setting is an error. Before anything
starts, the file is validated with the broker's own `load_config`; a refusal raises
`ReplicationUnavailable` with the reason. While the settings do not exist, RF 1 passes nothing (the
broker's behaviour is RF 1); once they exist RF 1 is written explicitly too (the cluster default will
be 3).

Everything lives in one temporary directory (etcd data, each broker's data dir and log, the optional
`file://` durable tier all brokers share); `stop()` kills every process, reaps it and removes the dir.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from ister.benchmark.stats import process_cpu_s
from ister.config import ClusterSettings, load_config
from ister.devcluster.broker import BrokerNode
from ister.devcluster.etcd import EtcdServer
from ister.errors import ConfigError, IsterError
from ister.metadata import keys
from ister.metadata.etcd import EtcdStore

START_SECONDS = 30.0  # bound on etcd / a broker becoming ready and on every broker registering


class ReplicationUnavailable(RuntimeError):
    """The brokers cannot run the asked replication factor (the settings are refused)."""


def replication_settings_exist() -> bool:
    """Does this Ister's configuration have `cluster.replication_factor`?"""
    return "replication_factor" in ClusterSettings.__struct_fields__


def default_min_insync(replication_factor: int) -> int:
    """A majority: 2 of 3 (the issue's default), 1 of 1, 3 of 5."""
    return replication_factor // 2 + 1


class BenchBrokerNode(BrokerNode):
    """One `ister broker --mode cluster` process of a BenchCluster (ister.devcluster's BrokerNode)."""

    def __init__(self, root: Path, index: int, args: list[str], env: dict[str, str]) -> None:
        super().__init__(root / f"b{index}", *args, env=env, log_path=root / f"b{index}.log")

    def start(self, timeout: float = START_SECONDS) -> None:
        try:
            super().start(timeout)
        except RuntimeError as exc:
            raise RuntimeError(f"ister broker {self.data_dir.name}: {exc}") from None

    def metrics(self) -> str:
        with urllib.request.urlopen(self.metrics_url, timeout=5.0) as response:
            return str(response.read().decode(errors="replace"))


class BenchCluster:
    """etcd + `brokers` cluster-mode brokers with `replication_factor`; a context manager."""

    def __init__(
        self,
        brokers: int = 3,
        *,
        replication_factor: int = 1,
        min_insync_replicas: int | None = None,
        fsync: str = "always",
        durable: bool = False,
        log_level: str = "warning",
    ) -> None:
        self.size = brokers
        self.replication_factor = replication_factor
        self.min_insync_replicas = min_insync_replicas or default_min_insync(replication_factor)
        self.fsync = fsync
        self.durable = durable
        self.log_level = log_level
        self.tmp = Path(tempfile.mkdtemp(prefix="ister-bench-cluster-"))
        self.etcd: EtcdServer | None = None
        self.nodes: list[BenchBrokerNode] = []
        self.config_file = self.tmp / "broker.yaml"

    @property
    def url(self) -> str:
        """The service URL clients start from (the first broker; lookups lead them to a topic's owner)."""
        return self.nodes[0].url

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes]

    @property
    def pids(self) -> list[int]:
        return [n.proc.pid for n in self.nodes if n.proc is not None]

    def cpu_seconds(self) -> float:
        """User + system CPU seconds of all the brokers so far."""
        return sum(process_cpu_s(pid) for pid in self.pids)

    def config(self) -> dict[str, Any]:
        """What the brokers' YAML config file holds."""
        out: dict[str, Any] = {}
        if self.replication_factor != 1 or replication_settings_exist():
            out["cluster"] = {
                "replication_factor": self.replication_factor,
                "min_insync_replicas": self.min_insync_replicas,
            }
        if self.durable:
            out["storage"] = {"durable": {"url": (self.tmp / "objects").as_uri()}}
        return out

    def check_config(self) -> None:
        """Validate the config file as the brokers will; ReplicationUnavailable when they would refuse it."""
        self.config_file.write_text(yaml.safe_dump(self.config()))
        try:
            load_config(self.config_file, environ={})
        except ConfigError as exc:
            if "replication_factor" in str(exc) or "min_insync_replicas" in str(exc):
                raise ReplicationUnavailable(
                    f"not available: replication not wired (the broker refuses cluster.replication_factor: "
                    f"{exc})"
                ) from None
            raise RuntimeError(f"bench cluster config refused: {exc}") from None

    def start(self) -> BenchCluster:
        try:
            self.check_config()
            self.etcd = EtcdServer(self.tmp / "etcd", name="bench")
            self.etcd.start()
            env = {
                **os.environ,
                "ISTER_LOAD_MANAGER__LOAD_REPORT_INTERVAL_SECONDS": "1",
            }
            args = [
                "--mode",
                "cluster",
                "--etcd-endpoints",
                self.etcd.endpoint,
                "--cluster-name",
                "bench",
                "--config-file",
                str(self.config_file),
                "--fsync",
                self.fsync,
                "--log-level",
                self.log_level,
            ]
            self.nodes = [BenchBrokerNode(self.tmp, i, args, env) for i in range(self.size)]
            for node in self.nodes:
                node.start()
            asyncio.run(self._wait_registered())
        except BaseException:
            self.stop()
            raise
        return self

    async def _wait_registered(self) -> None:
        """Every broker registered and a cluster leader elected (etcd)."""
        assert self.etcd is not None
        store = await EtcdStore.connect([self.etcd.endpoint])
        try:
            deadline = time.monotonic() + START_SECONDS
            while True:
                registered = keys.broker_ids(kv.key for kv in await store.list(keys.REGISTER_PREFIX))
                leader = await store.get(keys.LEADER)
                if len(registered) == self.size and leader is not None:
                    return
                for node in self.nodes:
                    if node.proc is None or node.proc.poll() is not None:
                        raise RuntimeError(f"ister broker {node.data_dir.name} exited:\n{node.log()}")
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{len(registered)} of {self.size} brokers registered within {START_SECONDS:.0f} s"
                    )
                await asyncio.sleep(0.05)  # poll interval
        finally:
            await store.close()

    def metric_families(self, prefix: str) -> list[str]:
        """Names of the metric lines starting with `prefix` any broker exports (empty when none answers)."""
        names: set[str] = set()
        for node in self.nodes:
            with contextlib.suppress(OSError, urllib.error.URLError):
                for line in node.metrics().splitlines():
                    if line.startswith(prefix):
                        names.add(line.split("{", 1)[0].split(" ", 1)[0])
        return sorted(names)

    def logs(self) -> str:
        return "\n".join(f"--- {n.data_dir.name}\n{n.log()}" for n in self.nodes)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        if self.etcd is not None:
            self.etcd.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> BenchCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


async def owner_of(url: str, topic: str) -> str | None:
    """The broker URL the lookup names for `topic` (as a client finds it)."""
    from ister.client import Client

    try:
        async with Client(url) as client:
            found = await client.lookup_with_retry(topic)
    except IsterError:
        return None
    return found.broker_url if found is not None else None
