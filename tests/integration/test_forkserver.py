"""The tests' broker fork server (tests/integration/forkserver.py): a forked `ister` runs with its own argv,
environment, working directory and log, reports its exit code and signal as `subprocess.Popen` would, and
nothing it started outlives the fork server; a broker meant for a network namespace is forked into it."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.integration import forkserver
from tests.integration.harness import BrokerProcess
from tests.integration.network import Network, unavailable
from tests.support import until_sync

pytestmark = pytest.mark.integration


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, **extra}


def _started_proc(data: Path) -> object:
    """The process object of a broker started on `data` (then stopped): forked or exec'd."""
    broker = BrokerProcess(data)
    broker.start()
    try:
        return broker.proc
    finally:
        broker.stop()


def test_a_forked_ister_has_its_own_argv_environment_and_log(tmp_path: Path) -> None:
    server = forkserver.ForkServer()
    try:
        log = tmp_path / "version.log"
        proc = server.spawn(["--version"], env(ISTER_COMMIT="forked0commit"), log, new_session=False)
        assert proc.wait(30) == 0
        assert "forked0commit" in log.read_text()
        # A bad argument: typer's usage error, exit code 2, as `python -m ister.cli` gives it.
        bad = server.spawn(["broker", "--mode", "nonsense"], env(), tmp_path / "bad.log", new_session=False)
        assert bad.wait(30) != 0
        assert "nonsense" in (tmp_path / "bad.log").read_text()
    finally:
        server.close()


def test_kill_terminate_and_wait_answer_as_popen_does(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "a")
    broker.start()
    server = forkserver.server()
    assert server is not None and forkserver.enabled()
    assert isinstance(broker.proc, forkserver.ForkedProcess), server.exec_reasons(dict(os.environ))
    with pytest.raises(subprocess.TimeoutExpired):
        broker.proc.wait(0.2)
    assert broker.terminate() == 0  # SIGTERM: the broker's graceful stop
    broker.start()  # again, on the same data dir and ports
    proc = broker.proc
    assert isinstance(proc, forkserver.ForkedProcess)
    proc.kill()
    assert proc.wait(30) == -signal.SIGKILL
    proc.kill()  # reaped: a second signal goes nowhere (the pid may belong to another process by now)
    broker.proc = None


def test_the_brokers_of_a_closed_fork_server_are_killed(tmp_path: Path) -> None:
    server = forkserver.ForkServer()
    broker = BrokerProcess(tmp_path / "b")
    broker.proc = server.spawn(broker.args(), env(), broker.log_path, new_session=True)
    broker.wait_listening()
    pid = broker.proc.pid
    server.close()

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    until_sync(gone, "the forked broker killed with its fork server", 10)
    with pytest.raises(RuntimeError, match="fork server exited"):
        server.call(op="poll", pid=pid)


def test_a_changed_start_time_variable_gets_a_fork_server_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A test that changes PYTHONPATH for good (as bench/chaos.py's import does) must not make every later
    broker an exec'd one: they are forked from a server started with the new value."""
    before = forkserver.server()
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    after = forkserver.server()
    assert after is not None and after is not before and not after.exec_reasons(dict(os.environ))
    assert isinstance(_started_proc(tmp_path / "p"), forkserver.ForkedProcess)


def test_turned_off_every_broker_is_execd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(forkserver.ENABLE_ENV, "0")
    assert isinstance(_started_proc(tmp_path / "c"), subprocess.Popen)


def test_a_broker_whose_environment_is_read_at_exec_is_execd(tmp_path: Path) -> None:
    """LD_PRELOAD (the disk-fault tests' library) takes effect only in an exec'd process."""
    preload = BrokerProcess(tmp_path / "d", env={"LD_PRELOAD": ""})
    plain = BrokerProcess(tmp_path / "e", env={"ISTER_LOG_LEVEL": "info"})
    try:
        preload.start()
        plain.start()
        assert isinstance(preload.proc, subprocess.Popen)
        assert isinstance(plain.proc, forkserver.ForkedProcess)
    finally:
        preload.stop()
        plain.stop()


def test_a_broker_in_a_network_namespace_is_forked_into_it(tmp_path: Path) -> None:
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    net = Network(1)
    try:
        net.create()
        host = net.hosts[0]
        broker = BrokerProcess(tmp_path / "n", host=host.ip, prefix=net.prefix_command(host))
        broker.start()  # listening on the namespace's address, reached over the bridge
        try:
            assert isinstance(broker.proc, forkserver.ForkedProcess)
            ours = os.stat(f"/proc/{broker.pid}/ns/net").st_ino
            assert ours == os.stat(f"/var/run/netns/{host.netns}").st_ino
            assert ours != os.stat("/proc/self/ns/net").st_ino
        finally:
            broker.stop()
    finally:
        net.close()
