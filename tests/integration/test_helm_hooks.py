"""The Helm chart's lifecycle hooks, as rendered, run against a real 2-broker cluster.

preStop must drain the pod's broker (its topics move to the other broker, `--wait` until done) and
postStart must make a returning broker active again. The hooks are taken from the rendered StatefulSet
and run with /bin/sh as the kubelet would, `/data` pointing at the broker's data directory and `ister`
being this checkout's. The secured variant (TLS and tokens) reaches the admin API over TLS at the pod's DNS
name (here `localhost`, which its test certificate names) with a token minted offline from the mounted
secret, as in a pod with `tls.enabled` and `auth.enabled`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
import trustme

from tests.etcd_server import EtcdServer
from tests.integration.forkserver import run_ister
from tests.integration.harness import BrokerProcess
from tests.support import until_sync
from tests.unit.test_helm_chart import BASE_VALUES, _container, render

pytestmark = pytest.mark.integration

SECRET = "a-signing-secret-for-the-hook-tests-0123456789"


POD_DNS = "${POD_NAME}.demo-ister-headless.msg.svc.cluster.local:50051"


def hook(values: dict[str, Any], name: str, broker: BrokerProcess, secrets: Path) -> str:
    command = _container(render(values))["lifecycle"][name]["exec"]["command"]
    assert command[:2] == ["/bin/sh", "-c"]
    text = str(command[2]).replace("/data/", f"{broker.data_dir}/").replace("/etc/ister/", f"{secrets}/")
    return text.replace(POD_DNS, f"localhost:{broker.admin_port}")


def secured(secrets: Path) -> tuple[dict[str, Any], list[str], dict[str, str]]:
    """Values, broker flags and broker environment for TLS (plain metrics, as the chart's default) and
    tokens, with the chart's drain principal a superuser."""
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    tls = secrets / "tls"
    tls.mkdir(parents=True)
    ca.cert_pem.write_to_path(str(tls / "ca.crt"))
    cert.private_key_pem.write_to_path(str(tls / "tls.key"))
    (tls / "tls.crt").write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
    values = {
        **BASE_VALUES,
        "tls": {"enabled": True, "secretName": "tls"},
        "auth": {"enabled": True, "jwtSecretName": "jwt"},
    }
    flags = [
        *("--tls-cert", str(tls / "tls.crt"), "--tls-key", str(tls / "tls.key")),
        *("--auth-jwt-secret-file", str(secrets / "jwt" / "secret"), "--superuser", "ister-drain"),
    ]
    env = {
        "ISTER_SECURITY__TLS__METRICS__ENABLED": "false",
        "ISTER_SECURITY__TLS__PEER_CA_FILE": str(tls / "ca.crt"),
    }
    return values, flags, env


def ready(broker: BrokerProcess) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{broker.prom_port}/readyz", timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_ister(list(args), timeout=60, env=env)


@pytest.mark.parametrize("secure", [False, True], ids=["plain", "tls-tokens"])
def test_pre_stop_drains_and_post_start_activates(
    tmp_path: Path, etcd_server: EtcdServer, secure: bool
) -> None:
    secrets = tmp_path / "etc"
    (secrets / "jwt").mkdir(parents=True)
    (secrets / "jwt" / "secret").write_text(SECRET)
    values: dict[str, Any] = dict(BASE_VALUES)
    extra = ["--mode", "cluster", "--etcd-endpoints", etcd_server.endpoint]
    broker_env = {"ISTER_CLUSTER__ETCD_NAMESPACE": "/h" + uuid.uuid4().hex[:12]}
    if secure:
        values, flags, more_env = secured(secrets)
        extra += flags
        broker_env.update(more_env)
    pod, other = (BrokerProcess(tmp_path / f"b{i}", *extra, env=broker_env) for i in range(2))
    pod.start()
    other.start()
    try:
        # The pod's environment: ISTER_ADMIN_ADDR is what the chart sets (the pod IP's admin port).
        env = {**os.environ, "ISTER_ADMIN_ADDR": pod.admin_addr, "POD_NAME": "demo-ister-0"}
        env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
        operator = dict(env)
        if secure:
            operator["ISTER_ADMIN_ADDR"] = f"https://localhost:{pod.admin_port}"
            operator["ISTER_TLS_CA"] = str(secrets / "tls" / "ca.crt")
            minted = cli(
                *("admin", "security", "tokens", "create", "--principal", "ister-drain"),
                *("--secret-file", str(secrets / "jwt" / "secret"), "--ttl", "10m"),
                env=env,
            )
            operator["ISTER_TOKEN"] = minted.stdout.strip().splitlines()[-1]
        pod_id = (pod.data_dir / "broker_id").read_text().strip()
        for n in range(6):  # topics spread over both brokers by the assigner
            made = cli("admin", "topics", "create", f"/default/hook-{n}", env=operator)
            assert made.returncode == 0, made.stderr
        until_sync(lambda: ready(pod) == 200 and ready(other) == 200, "both brokers ready")

        stop = subprocess.run(
            ["/bin/sh", "-c", hook(values, "preStop", pod, secrets)],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert stop.returncode == 0, stop.stderr
        assert f"broker {pod_id} drained" in stop.stdout, stop.stdout + stop.stderr
        held = cli("admin", "topics", "list", "--broker", pod_id, "-o", "json", env=operator)
        assert held.returncode == 0 and json.loads(held.stdout) == [], held.stdout + held.stderr
        until_sync(lambda: ready(pod) == 503, "the drained broker to say not ready")

        start = subprocess.run(
            ["/bin/sh", "-c", hook(values, "postStart", pod, secrets)],
            capture_output=True,
            text=True,
            timeout=150,
            env=env,
        )
        assert start.returncode == 0, start.stderr
        until_sync(lambda: ready(pod) == 200, "the reactivated broker to be ready")
        brokers = json.loads(cli("admin", "brokers", "list", "-o", "json", env=operator).stdout)
        assert {b["broker_id"]: b["broker_status"] for b in brokers}[pod_id] == "active"
    finally:
        pod.stop()
        other.stop()
