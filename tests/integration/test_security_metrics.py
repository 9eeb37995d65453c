"""The metrics endpoint of a real broker over TLS (the broker certificate) behind a bearer token, as a
Prometheus scrape config with `scheme: https`, `tls_config.ca_file` and `authorization.credentials_file`
reaches it."""

from __future__ import annotations

import http.client
import os
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.integration.harness import BrokerProcess
from tests.integration.security_support import Pki, make_pki
from tests.support import until_sync

pytestmark = pytest.mark.integration

TOKEN = "scrape-token-7f3a9c1e5b"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("metrics-token") / "token"
    path.write_text(TOKEN + "\n")
    return path


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, pki: Pki, token_file: Path) -> Iterator[BrokerProcess]:
    base = tmp_path_factory.mktemp("metrics-tls")
    config = base / "broker.yaml"
    config.write_text(yaml.safe_dump({"security": {"metrics": {"bearer_token_file": str(token_file)}}}))
    broker = BrokerProcess(
        base / "data",
        *("--config-file", str(config)),
        *("--tls-cert", str(pki.cert_file), "--tls-key", str(pki.key_file)),
    )
    broker.start()
    yield broker
    broker.stop()


def scrape(
    broker: BrokerProcess, pki: Pki, authorization: str | None, path: str = "/metrics"
) -> tuple[int, dict[str, str], bytes]:
    ctx = ssl.create_default_context(cafile=str(pki.ca_file))
    conn = http.client.HTTPSConnection("127.0.0.1", broker.prom_port, context=ctx, timeout=10)
    try:
        headers = {"Authorization": authorization} if authorization is not None else {}
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def test_https_scrape_with_the_token_gets_metrics(broker: BrokerProcess, pki: Pki) -> None:
    status, headers, body = scrape(broker, pki, f"Bearer {TOKEN}")
    assert status == 200, body
    assert headers["content-type"].startswith("text/plain; version=0.0.4")
    assert b"ister_" in body
    # Several scrapes on one keep-alive TLS connection, as Prometheus does.
    ctx = ssl.create_default_context(cafile=str(pki.ca_file))
    conn = http.client.HTTPSConnection("127.0.0.1", broker.prom_port, context=ctx, timeout=10)
    for _ in range(3):
        conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        resp = conn.getresponse()
        assert resp.status == 200 and b"ister_" in resp.read()
    conn.close()


@pytest.mark.parametrize(
    ("authorization", "error"),
    [
        (None, False),
        ("Basic " + "dXNlcjpwYXNz", False),
        ("Bearer wrong-token", True),
        (f"Bearer {TOKEN}x", True),
        (f"Bearer {TOKEN[:-1]}", True),
    ],
)
def test_missing_or_wrong_token_is_401_with_a_challenge(
    broker: BrokerProcess, pki: Pki, authorization: str | None, error: bool
) -> None:
    for path in ("/metrics", "/elsewhere"):
        status, headers, body = scrape(broker, pki, authorization, path)
        assert status == 401
        assert headers["www-authenticate"].startswith("Bearer")
        assert ('error="invalid_token"' in headers["www-authenticate"]) is error
        assert b"ister_" not in body


def test_plaintext_scrape_of_the_tls_port_fails(broker: BrokerProcess) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", broker.prom_port, timeout=10)
    with pytest.raises((http.client.HTTPException, ConnectionError)):
        conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        conn.getresponse()
    conn.close()


def test_untrusted_certificate_is_refused_by_the_scraper(broker: BrokerProcess, tmp_path: Path) -> None:
    other = make_pki(tmp_path / "other")
    ctx = ssl.create_default_context(cafile=str(other.ca_file))
    conn = http.client.HTTPSConnection("127.0.0.1", broker.prom_port, context=ctx, timeout=10)
    with pytest.raises(ssl.SSLCertVerificationError):
        conn.request("GET", "/metrics")
    conn.close()


def test_rotated_token_file_takes_effect_and_token_never_logged(
    broker: BrokerProcess, pki: Pki, token_file: Path
) -> None:
    new = "rotated-token-0d2e4f"
    tmp = token_file.with_suffix(".new")
    tmp.write_text(new)
    os.replace(tmp, token_file)
    try:
        until_sync(
            lambda: scrape(broker, pki, f"Bearer {new}")[0] == 200, "the rotated token accepted", poll=0.05
        )
        assert scrape(broker, pki, f"Bearer {TOKEN}")[0] == 401
    finally:
        tmp.write_text(TOKEN)
        os.replace(tmp, token_file)
    until_sync(lambda: scrape(broker, pki, f"Bearer {TOKEN}")[0] == 200, "the first token back", poll=0.05)
    log = broker.log()
    assert TOKEN not in log and new not in log
