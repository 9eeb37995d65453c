"""One local[2] Spark session for the whole run (JVM start and Python workers cost ~15 s), and a
standalone broker whose WAL segments are small and exported within a second to its file:// tier."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.harness import BrokerProcess


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under `pytest -n`, every Spark test runs in one worker: one JVM for the run, not one per worker."""
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.xdist_group("spark"))


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable  # workers use this venv (ister, pyarrow)
    from ister.spark.pipeline import local_session

    conf = {"spark.sql.shuffle.partitions": "2", "spark.driver.memory": "1g"}
    # The JVM is started by a fork of this process; beside another pytest worker on two busy cores it has
    # once exited before sending its port ("Java gateway process exited"). That is the launch failing, not
    # Spark or Ister: try again (three attempts), and fail with the last error if it keeps happening.
    for attempt in range(3):
        try:
            session = local_session("local[2]", **conf)
            break
        except Exception as exc:  # pyspark's PySparkRuntimeError (JAVA_GATEWAY_EXITED) and its kin
            if attempt == 2 or "gateway" not in str(exc).lower():
                raise
            print(f"spark: the JVM did not start ({exc}); trying again", file=sys.stderr)
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def durable_config(path: Path) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "wal": {"segment_max_bytes": 32 * 1024},
                "storage": {
                    "durable": {
                        "export_interval_seconds": 0.2,
                        "segment_max_age_seconds": 3600,  # only full segments are exported: a tail stays
                        "local_retention_bytes": 0,
                        "local_retention_seconds": 0,
                    }
                },
            }
        )
    )
    return path


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    root = tmp_path_factory.mktemp("spark-broker")
    b = BrokerProcess(root / "data", "--config-file", str(durable_config(root / "ister.yml")))
    b.start()
    yield b
    b.stop()
