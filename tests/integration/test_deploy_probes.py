"""The health checks the deployment files run, against real brokers (docs/deploy.md).

- the container image's HEALTHCHECK command (deploy/Containerfile), run as the engine runs it;
- deploy/systemd/ister-wait-ready, the unit's ExecStartPost: ready broker, no broker, drained broker.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.etcd_server import EtcdServer
from tests.integration.harness import BrokerProcess
from tests.support import free_port, until_sync
from tests.unit.test_deploy_files import CONTAINERFILE, instructions, stages

pytestmark = pytest.mark.integration

WAIT_READY = Path(__file__).resolve().parents[2] / "deploy" / "systemd" / "ister-wait-ready"


def healthcheck_command() -> list[str]:
    """The final stage's HEALTHCHECK CMD (exec form), with this interpreter for the image's python."""
    (health,) = [rest for word, rest in stages(instructions(CONTAINERFILE))[-1] if word == "HEALTHCHECK"]
    command = json.loads(health[health.index("CMD") + 3 :])
    assert command[0].startswith("python3")
    return [sys.executable, *command[1:]]


def run(command: list[str], env: dict[str, str], timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)


def readyz_status(addr: str) -> int:
    try:
        with urllib.request.urlopen(f"http://{addr}/readyz", timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_image_healthcheck_and_the_units_readiness_check_pass_on_a_serving_broker(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data")
    broker.start()
    try:
        env = {"ISTER_PROM_EXPORTER": f"0.0.0.0:{broker.prom_port}"}  # as the image sets it
        assert run(healthcheck_command(), env).returncode == 0
        ready = run([sys.executable, str(WAIT_READY), "--timeout", "20"], env)
        assert ready.returncode == 0, ready.stderr
        assert f"127.0.0.1:{broker.prom_port}/readyz" in ready.stdout
    finally:
        broker.stop()


def test_both_checks_fail_where_no_broker_answers() -> None:
    env = {"ISTER_PROM_EXPORTER": f"127.0.0.1:{free_port()}"}
    assert run(healthcheck_command(), env).returncode != 0
    waited = run([sys.executable, str(WAIT_READY), "--timeout", "1"], env)
    assert waited.returncode == 1
    assert "not ready after 1 s" in waited.stderr and "refused" in waited.stderr.lower()
    bad = run([sys.executable, str(WAIT_READY), "no-port-here"], {})
    assert bad.returncode == 2 and "expected HOST:PORT" in bad.stderr


def test_a_drained_broker_counts_as_started(tmp_path: Path, etcd_server: EtcdServer) -> None:
    """Drained by an operator, the broker serves but is not ready: the unit must not fail (a restart
    would keep the drain) and says why. Two brokers: the last active one cannot be drained."""
    namespace = {"ISTER_CLUSTER__ETCD_NAMESPACE": "/d" + uuid.uuid4().hex[:12]}
    args = ("--mode", "cluster", "--etcd-endpoints", etcd_server.endpoint)
    broker, other = (BrokerProcess(tmp_path / f"b{i}", *args, env=namespace) for i in range(2))
    broker.start()
    other.start()
    try:
        addr = f"127.0.0.1:{broker.prom_port}"
        assert run([sys.executable, str(WAIT_READY), "--timeout", "30", addr], {}).returncode == 0
        broker_id = (broker.data_dir / "broker_id").read_text().strip()
        ister = [sys.executable, "-m", "ister.cli", "admin", "brokers"]
        drain = run([*ister, "drain", broker_id, "--wait", "--admin-addr", broker.admin_addr], {})
        assert drain.returncode == 0, drain.stderr
        # /readyz answers the probes' last result (taken every second): wait for it to show the drain.
        until_sync(lambda: readyz_status(addr) == 503, "/readyz to say not ready after the drain")
        waited = run([sys.executable, str(WAIT_READY), "--timeout", "30", addr], {})
        assert waited.returncode == 0, waited.stderr
        assert "drained" in waited.stdout and "ister admin brokers activate" in waited.stdout
    finally:
        broker.stop()
        other.stop()
