"""A local[2] Spark session per test worker (JVM start and Python workers cost ~15 s), and a
standalone broker whose WAL segments are small and exported within a second to its file:// tier."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.harness import BrokerProcess

# Under `pytest -n`, the Spark tests run in two workers, each with one JVM for its share: in one worker
# they were the suite's longest path (about 14 of its 17 minutes). The shares are by file, near equal in
# time, each with one of the two tests that start drivers of their own (the export pipeline's two runs in
# spark-a, sink_driver.py in spark-b); measured shares in docs/architecture.md §15.
_SPARK_GROUP_B = {
    "test_spark_kafka_habits.py",
    "test_spark_source.py",
    "test_spark_exactly_once.py",
    "test_spark_streaming.py",
}
_LAST_IN_SPARK_B = "test_spark_exactly_once.py"


# tryfirst: xdist's worker turns xdist_group marks into the nodeid's @group suffix in its own hook; when
# this directory is named on the command line its conftest is loaded before that plugin, and without
# tryfirst its hook ran after it: no group, a JVM (or browser) on every worker.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            group = "spark-b" if item.path.name in _SPARK_GROUP_B else "spark-a"
            item.add_marker(pytest.mark.xdist_group(group))
    # Each group runs its tests in collection order, so both began with their driver-killing test (the
    # export's two drivers in spark-a, sink_driver.py in spark-b): four JVMs starting at once, and at load
    # 20 the export test passed its 400 s. spark-b's runs last instead (a stable sort: the rest keep order).
    items.sort(key=lambda item: item.path.name == _LAST_IN_SPARK_B and here in item.path.parents)


class _PopenWithoutPreexec(subprocess.Popen[bytes]):
    """PySpark starts its JVM with `preexec_fn` (to ignore SIGINT), which makes Python fork() and run code
    in the child. A pytest worker that already used gRPC has gRPC's threads and fork handlers: that child
    then crashed before exec (SIGSEGV, 'Java gateway process exited') in 9 of 32 launches beside a busy
    gRPC thread; without `preexec_fn`, 0 of 15. Without `preexec_fn` Python spawns with vfork (no fork
    handlers, no Python in the child); SIGINT is ignored around the spawn instead, which the JVM inherits."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.pop("preexec_fn", None)
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            super().__init__(*args, **kwargs)
        finally:
            signal.signal(signal.SIGINT, previous)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable  # workers use this venv (ister, pyarrow)
    # conf/spark-defaults.conf: for this JVM and the drivers that tests start as processes (inherited).
    os.environ["SPARK_CONF_DIR"] = str(Path(__file__).parent / "conf")
    import pyspark.java_gateway

    from ister.spark.pipeline import local_session

    conf = {"spark.driver.memory": "1g"}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pyspark.java_gateway, "Popen", _PopenWithoutPreexec)
        session = local_session("local[2]", **conf)
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
