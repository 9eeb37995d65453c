"""What each service of a development cluster runs: the one source of `ister dev up` (on this machine)
and of deploy/compose.yaml (`ister dev compose`, in containers).

A `Layout` says where things are for one of the two (addresses, directories); the functions here turn
it into each service's command line and the brokers' shared config file, so both run the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ister.devcluster.group import cluster_args
from ister.devcluster.seaweed import GRPC_OFFSET, s3_options

CLUSTER_NAME = "ister-dev"
BUCKET = "ister-dev"
MAX_BROKERS = 9
MAX_REPLICATION = 3
LEASE_TTL_SECONDS = 5
WEED_SERVICES = ("s3", "master", "volume", "filer", "admin", "iceberg", "lance")

# Without --port-base: the usual ports (Danube's for brokers, etcd's, SeaweedFS's S3), broker i at +i.
DEFAULT_BROKER_PORTS = (6650, 50051, 9040)
DEFAULT_ETCD_PORTS = (2379, 2380)
DEFAULT_CONSOLE_PORT = 8080  # `ister console`'s own default
DEFAULT_WEED_PORTS = {
    "s3": 8333,
    "master": 9333,
    "volume": 9334,
    "filer": 8888,
    "admin": 23646,
    "iceberg": 8181,
    "lance": 8182,
}
BASE_SPAN = 10 + 3 * MAX_BROKERS  # ports used from --port-base on
MAX_PORT_BASE = 65535 - GRPC_OFFSET - BASE_SPAN  # weed's gRPC ports lie GRPC_OFFSET above its HTTP ones


@dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    weed: dict[str, int]
    brokers: list[tuple[int, int, int]]  # client, admin, metrics
    console: int = DEFAULT_CONSOLE_PORT

    def named(self, s3: bool, console: bool = False) -> list[tuple[str, int]]:
        """Every port the cluster listens on, with what listens there."""
        out = [("etcd client", self.etcd_client), ("etcd peer", self.etcd_peer)]
        if console:
            out.append(("console", self.console))
        if s3:
            for name, port in self.weed.items():
                out.append((f"SeaweedFS {name}", port))
                if name not in ("iceberg", "lance"):  # HTTP only
                    out.append((f"SeaweedFS {name} gRPC", port + GRPC_OFFSET))
        for i, (client, admin, metrics) in enumerate(self.brokers):
            out += [
                (f"broker-{i} client", client),
                (f"broker-{i} admin", admin),
                (f"broker-{i} metrics", metrics),
            ]
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "etcd_client": self.etcd_client,
            "etcd_peer": self.etcd_peer,
            "weed": self.weed,
            "brokers": [list(b) for b in self.brokers],
            "console": self.console,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Ports:
        return cls(
            int(raw["etcd_client"]),
            int(raw["etcd_peer"]),
            {str(k): int(v) for k, v in raw["weed"].items()},
            [(int(a), int(b), int(c)) for a, b, c in raw["brokers"]],
            int(raw.get("console", DEFAULT_CONSOLE_PORT)),  # plans written before the console had none
        )


def plan_ports(brokers: int, base: int | None) -> Ports:
    """The ports of a cluster of `brokers`: the usual ones, or a block from `base` on (tests, or beside
    another cluster)."""
    if not 1 <= brokers <= MAX_BROKERS:
        raise ValueError(f"--brokers must be in 1..{MAX_BROKERS}, not {brokers}")
    if base is None:
        c, a, m = DEFAULT_BROKER_PORTS
        return Ports(
            *DEFAULT_ETCD_PORTS, dict(DEFAULT_WEED_PORTS), [(c + i, a + i, m + i) for i in range(brokers)]
        )
    if not 1024 <= base <= MAX_PORT_BASE:
        raise ValueError(f"--port-base must be in 1024..{MAX_PORT_BASE}, not {base}")
    weed = {name: base + 2 + i for i, name in enumerate(WEED_SERVICES)}
    return Ports(
        base,
        base + 1,
        weed,
        [(base + 10 + 3 * i, base + 11 + 3 * i, base + 12 + 3 * i) for i in range(brokers)],
        base + 9,  # after the 7 SeaweedFS ports
    )


def replication_factor(brokers: int) -> int:
    return min(MAX_REPLICATION, brokers)


@dataclass(frozen=True)
class S3Target:
    """Where the brokers' durable tier is, when it is S3 (SeaweedFS)."""

    endpoint: str
    bucket: str = BUCKET

    def options(self) -> dict[str, str]:
        return s3_options(self.endpoint)


@dataclass(frozen=True)
class BrokerPlan:
    """What every broker of the cluster shares: its etcd, its durable tier, its replication."""

    brokers: int
    etcd_endpoints: list[str]
    s3: S3Target | None = None
    file_tier: str | None = None  # a `file://` URL when there is no S3
    # the Iceberg catalog every broker shares (docs/tables.md); unset, each broker's own SQLite file would
    # hold only the tables of the topics it led, and `ister table` would name a catalog without the rest
    catalog_uri: str | None = None
    extra_config: dict[str, Any] = field(default_factory=dict)

    def config(self) -> dict[str, Any]:
        """The brokers' config file (ister.yml)."""
        rf = replication_factor(self.brokers)
        durable: dict[str, Any]
        if self.s3 is not None:
            durable = {"url": f"s3://{self.s3.bucket}", "options": self.s3.options()}
        else:
            durable = {"url": self.file_tier or "none"}
        out: dict[str, Any] = {
            "cluster": {"replication_factor": rf, "lease_ttl_seconds": LEASE_TTL_SECONDS},
            "storage": {"durable": durable},
        }
        if self.catalog_uri is not None:
            out["tables"] = {"catalog_uri": self.catalog_uri}
        for key, value in self.extra_config.items():
            out[key] = {**out.get(key, {}), **value} if isinstance(value, dict) else value
        return out

    def config_yaml(self) -> str:
        return yaml.safe_dump(self.config(), sort_keys=True)

    def args(self, config_file: Path | str) -> list[str]:
        """The cluster part of every broker's `ister broker` command line."""
        return cluster_args(self.etcd_endpoints, CLUSTER_NAME, "--config-file", str(config_file))
