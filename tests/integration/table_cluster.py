"""Three brokers on etcd with RF 3, a SeaweedFS durable tier and one table catalog they share
(`catalog_uri`): the cluster of the table tests (`test_tables_cluster.py`, `test_tables_postgres.py`)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import yaml

from tests.integration.cluster import Cluster
from tests.seaweed_server import SeaweedServer


@asynccontextmanager
async def table_cluster(
    tmp_path: Path, etcd_endpoint: str, seaweed: SeaweedServer, catalog_uri: str
) -> AsyncIterator[Cluster]:
    """The running cluster; its `secret` is the S3 secret a reader of the tables adds (never printed)."""
    prefix = uuid.uuid4().hex[:8]
    config = tmp_path / "ister.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "wal": {"segment_max_bytes": 64 * 1024},
                "storage": {
                    "durable": {
                        "url": f"{seaweed.url}/{prefix}",
                        "options": seaweed.options(),
                        "export_interval_seconds": 0.2,
                        "segment_max_age_seconds": 0.5,
                    },
                },
                "tables": {"catalog_uri": catalog_uri},
            }
        )
    )
    env = {"ISTER_CLUSTER__REPLICATION_FACTOR": "3", "ISTER_CLUSTER__MIN_INSYNC_REPLICAS": "2"}
    c = Cluster(tmp_path, etcd_endpoint, 3, 2, "--config-file", str(config), env=env)
    c.secret = seaweed.options()["secret_access_key"]  # type: ignore[attr-defined]
    try:
        await c.start()
        yield c
    finally:
        await c.stop()
