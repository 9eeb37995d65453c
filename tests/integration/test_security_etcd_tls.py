"""TLS to etcd, the one path brokers coordinate through: a real etcd serving TLS only and requiring client
certificates (`--client-cert-auth`), brokers in cluster mode with `--etcd-tls-ca/-cert/-key` that create and
serve topics through it, and brokers whose TLS settings are missing or wrong refused at start with a
message that says what to fix."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from ister.metadata.etcd import EtcdTls
from tests.etcd_server import EtcdServer, EtcdServerTls, etcd_binary
from tests.integration.cluster import Cluster
from tests.integration.harness import ISTER, client, consumer, producer, take
from tests.integration.security_support import Pki, make_pki
from tests.support import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

START_FAILS_WITHIN = 60.0  # a broker that cannot reach etcd exits after one connection attempt per endpoint


@pytest.fixture(scope="module")
def etcd_pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("etcd-pki"), "etcd")


@pytest.fixture(scope="module")
def broker_cert(etcd_pki: Pki) -> tuple[Path, Path]:
    return etcd_pki.client("ister-broker")


@pytest.fixture(scope="module")
def tls_etcd(
    tmp_path_factory: pytest.TempPathFactory, etcd_pki: Pki, broker_cert: tuple[Path, Path]
) -> Iterator[EtcdServer]:
    if etcd_binary() is None:
        pytest.skip("etcd is not installed (apt-get install etcd-server)")
    tls = EtcdServerTls(etcd_pki.cert_file, etcd_pki.key_file, etcd_pki.ca_file, *broker_cert)
    server = EtcdServer(tmp_path_factory.mktemp("etcd-tls"), name="ister-tls", tls=tls)
    server.start()
    yield server
    server.stop()


def tls_flags(ca: Path, cert: tuple[Path, Path] | None) -> list[str]:
    flags = ["--etcd-tls-ca", str(ca)]
    if cert is not None:
        flags += ["--etcd-tls-cert", str(cert[0]), "--etcd-tls-key", str(cert[1])]
    return flags


@pytest.fixture
async def cluster(
    tmp_path: Path, tls_etcd: EtcdServer, etcd_pki: Pki, broker_cert: tuple[Path, Path]
) -> AsyncIterator[Cluster]:
    store_tls = EtcdTls(
        etcd_pki.ca_file.read_bytes(), broker_cert[0].read_bytes(), broker_cert[1].read_bytes()
    )
    c = Cluster(
        tmp_path,
        tls_etcd.url,
        2,
        2,
        *tls_flags(etcd_pki.ca_file, broker_cert),
        etcd_tls=store_tls,
    )
    try:
        await c.start()
        yield c
    finally:
        await c.stop()


async def test_brokers_create_and_serve_topics_through_etcd_over_tls(cluster: Cluster) -> None:
    # Both brokers registered through etcd over TLS (Cluster.start waits for it); a topic created on one
    # is assigned by the leader (through etcd) and served, whichever broker owns it.
    c = await client(cluster.brokers[0].url)
    topic = "/default/etcd-tls"
    p = await producer(c, topic, "p", reliable=True)
    cons, queue = await consumer(c, topic, "c", "s")
    for i in range(3):
        await p.send(f"m{i}".encode(), {})
    got = await take(queue, 3, ack=cons)
    assert [m.payload for m in got] == [b"m0", b"m1", b"m2"]
    owners = await cluster.assignments()
    assert topic in owners and owners[topic] in await cluster.live()
    await cons.close()


def start_broker(tmp_path: Path, endpoint: str, *flags: str) -> subprocess.CompletedProcess[str]:
    """Run a cluster-mode broker that is expected to fail at start; its exit and output."""
    return subprocess.run(
        [
            *ISTER,
            "broker",
            "--mode",
            "cluster",
            "--etcd-endpoints",
            endpoint,
            "--data-dir",
            str(tmp_path / "data"),
            "--broker-addr",
            f"127.0.0.1:{free_port()}",
            "--admin-addr",
            f"127.0.0.1:{free_port()}",
            "--prom-exporter",
            f"127.0.0.1:{free_port()}",
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=START_FAILS_WITHIN,
        check=False,
    )


def test_https_endpoint_without_a_ca_is_a_config_error(tmp_path: Path, tls_etcd: EtcdServer) -> None:
    run = start_broker(tmp_path, tls_etcd.url)
    assert run.returncode == 2, run.stderr
    assert "cluster.etcd_tls.ca_file is not set" in run.stderr


def test_missing_tls_files_are_config_errors(tmp_path: Path, tls_etcd: EtcdServer, etcd_pki: Pki) -> None:
    run = start_broker(tmp_path, tls_etcd.url, "--etcd-tls-ca", str(tmp_path / "nope.pem"))
    assert run.returncode == 2, run.stderr
    assert "cluster.etcd_tls.ca_file: file" in run.stderr and "does not exist" in run.stderr
    run = start_broker(
        tmp_path,
        tls_etcd.url,
        "--etcd-tls-ca",
        str(etcd_pki.ca_file),
        "--etcd-tls-cert",
        str(etcd_pki.ca_file),
    )
    assert run.returncode == 2, run.stderr
    assert "cert_file and key_file go together" in run.stderr


def test_plaintext_broker_against_tls_etcd_fails_at_start(tmp_path: Path, tls_etcd: EtcdServer) -> None:
    run = start_broker(tmp_path, tls_etcd.endpoint)
    assert run.returncode == 1, run.stderr
    assert f"cannot reach etcd at http://{tls_etcd.endpoint}" in run.stderr
    assert "if etcd serves TLS: https:// endpoints and cluster.etcd_tls.ca_file" in run.stderr


def test_broker_with_another_ca_fails_at_start(
    tmp_path: Path, tls_etcd: EtcdServer, broker_cert: tuple[Path, Path]
) -> None:
    other = make_pki(tmp_path / "other", "other")
    run = start_broker(tmp_path, tls_etcd.url, *tls_flags(other.ca_file, broker_cert))
    assert run.returncode == 1, run.stderr
    assert f"cannot reach etcd at {tls_etcd.url}" in run.stderr
    assert "TLS to etcd failed: cluster.etcd_tls.ca_file must be the CA" in run.stderr


def test_broker_without_a_client_certificate_fails_at_start(
    tmp_path: Path, tls_etcd: EtcdServer, etcd_pki: Pki
) -> None:
    run = start_broker(tmp_path, tls_etcd.url, *tls_flags(etcd_pki.ca_file, None))
    assert run.returncode == 1, run.stderr
    assert f"cannot reach etcd at {tls_etcd.url}" in run.stderr
    assert "needs cluster.etcd_tls.cert_file/key_file" in run.stderr
