"""`ister.wire` and the official `danube` client both register the `danube.*` protobuf symbols, so they
cannot share one process. Test modules that need Ister's gRPC server skip their tests when `danube` is
already loaded (a whole-suite run that collected the integration tests) and run themselves again in a
fresh interpreter instead, through `run_module_in_child`."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

SHARED_WITH_DANUBE = "runs in a child process (danube's protos are loaded here)"
CHILD_TEST = "test_in_child_process"


def danube_loaded() -> bool:
    return "danube" in sys.modules


def skip_if_sharing(request: pytest.FixtureRequest) -> None:
    """For an autouse fixture: skip every test but the child runner while danube is loaded."""
    if danube_loaded() and request.node.name != CHILD_TEST:
        pytest.skip(SHARED_WITH_DANUBE)


def run_module_in_child(path: str) -> None:
    if not danube_loaded():
        pytest.skip("the tests of this module run in this process")
    # The child is a plain pytest run (none of this run's options), but under `pytest -n` it keeps its
    # worker's name and count, which decide the ports it may pick (ister.benchmark.broker.port_range).
    keep = ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_") or k in keep}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", path],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert " passed" in result.stdout


async def start_client_server(*args: Any, **kwargs: Any) -> Any:
    """`ister.server.grpc_server.start_client_server`, imported only when called (it loads ister.wire)."""
    from ister.server.grpc_server import start_client_server as start

    return await start(*args, **kwargs)
