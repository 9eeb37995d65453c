"""Minting tokens through the admin API (IsterAdmin.CreateToken, `ister admin security tokens create`
without --secret-file) against a real broker: the CLI prints a token signed by the broker with its issuer
and audience, which the official client then uses; the TTL is bounded by
security.auth.jwt.max_token_ttl_seconds; callers without ManageCluster are refused (and allowed once a role
grants it); a broker with only public keys refuses (FAILED_PRECONDITION); the mint is audited, the token
never logged."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import danube
import grpc
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from ister.wire.gen import DanubeAdmin_pb2 as apb
from ister.wire.gen import DanubeAdmin_pb2_grpc as apb_grpc
from tests.integration.forkserver import run_ister
from tests.integration.harness import BrokerProcess, consumer, producer, take
from tests.integration.security_support import Pki, make_pki, secret_file, token

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

AUDIENCE = "ister-mint-test"
ISSUER = "ister-test-issuer"
MAX_TTL = 7200


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[BrokerProcess]:
    base = tmp_path_factory.mktemp("tokens")
    proc = BrokerProcess(
        base / "data",
        *("--tls-cert", str(pki.cert_file), "--tls-key", str(pki.key_file)),
        *("--auth-jwt-secret-file", str(secret_file(base)), "--superuser", "root"),
        env={
            "ISTER_SECURITY__AUTH__JWT__AUDIENCE": AUDIENCE,
            "ISTER_SECURITY__AUTH__JWT__ISSUER": ISSUER,
            "ISTER_SECURITY__AUTH__JWT__MAX_TOKEN_TTL_SECONDS": str(MAX_TTL),
        },
    )
    proc.start()
    yield proc
    proc.stop()


def root_token() -> str:
    return token("root", issuer=ISSUER, audience=AUDIENCE)


def ister(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ISTER_TOKEN", "ISTER_API_KEY")}
    return run_ister(list(args), timeout=60, env=env)


def mint_cli(broker: BrokerProcess, pki: Pki, caller: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`ister admin --token <caller> security tokens create ...` without --secret-file."""
    return ister(
        *("admin", "--token", caller, "--tls-ca", str(pki.ca_file), "security", "tokens", "create"),
        *args,
        *("--admin-addr", broker.admin_addr),
    )


async def grant(broker: BrokerProcess, pki: Pki, principal: str, role: str, permissions: list[str]) -> None:
    creds = grpc.ssl_channel_credentials(pki.ca_file.read_bytes())
    md = [("authorization", f"Bearer {root_token()}")]
    async with grpc.aio.secure_channel(broker.admin_addr, creds) as ch:
        stub = apb_grpc.SecurityAdminStub(ch)
        await stub.CreateRole(
            apb.CreateRoleRequest(role=apb.RoleDefinition(name=role, permissions=permissions)),
            metadata=md,
            timeout=10,
        )
        binding = apb.BindingDefinition(
            id=f"{role}-{principal}",
            principal_type="service_account",
            principal_name=principal,
            role_names=[role],
            scope="cluster",
            resource_name="",
        )
        await stub.CreateBinding(apb.CreateBindingRequest(binding=binding), metadata=md, timeout=10)


async def test_cli_mints_through_the_admin_api_and_the_official_client_uses_it(
    broker: BrokerProcess, pki: Pki
) -> None:
    out = mint_cli(broker, pki, root_token(), "--principal", "minted-app", "--ttl", "1h")
    assert out.returncode == 0, out.stderr
    minted = out.stdout.strip().splitlines()[-1]
    claims = jwt.decode(minted, options={"verify_signature": False})
    assert claims["principal_name"] == "minted-app" and claims["principal_type"] == "service_account"
    assert claims["aud"] == AUDIENCE and claims["iss"] == ISSUER
    assert claims["exp"] - claims["iat"] == 3600 and abs(claims["iat"] - time.time()) < 60

    await grant(broker, pki, "minted-app", "minted-rw", ["Produce", "Consume", "Lookup"])
    client = await (
        danube.DanubeClientBuilder()
        .service_url(f"https://127.0.0.1:{broker.port}")
        .with_tls(str(pki.ca_file))
        .with_token(minted)
        .build()
    )
    topic = "/default/minted"
    p = await producer(client, topic, "p", reliable=True)
    cons, queue = await consumer(client, topic, "c", "s")
    await p.send(b"with a minted token", {})
    got = await take(queue, 1, ack=cons)
    assert [m.payload for m in got] == [b"with a minted token"]
    await cons.close()

    log = broker.log_path.read_text()
    assert minted not in log
    assert (
        "audit principal=service_account:root action=IsterAdmin.CreateToken "
        "resource=token:service_account:minted-app:3600s result=ok"
    ) in log


def test_ttl_above_the_maximum_is_refused(broker: BrokerProcess, pki: Pki) -> None:
    out = mint_cli(broker, pki, root_token(), "--principal", "x", "--ttl", f"{MAX_TTL + 1}s")
    assert out.returncode == 1
    assert f"ttl_seconds must be in 1..{MAX_TTL}" in out.stderr and "INVALID_ARGUMENT" in out.stderr
    out = mint_cli(broker, pki, root_token(), "--principal", "x", "--ttl", "2h", "--audience", "other")
    assert out.returncode == 2 and "--issuer and --audience need --secret-file" in out.stderr


async def test_minting_needs_manage_cluster(broker: BrokerProcess, pki: Pki) -> None:
    ops = token("ops", issuer=ISSUER, audience=AUDIENCE)
    out = mint_cli(broker, pki, ops, "--principal", "someone", "--ttl", "10m")
    assert out.returncode == 1
    assert "PERMISSION_DENIED" in out.stderr and "permission ManageCluster" in out.stderr
    assert "audit principal=service_account:ops action=IsterAdmin.CreateToken" in broker.log_path.read_text()
    # Without any token: UNAUTHENTICATED.
    out = ister(
        *("admin", "--tls-ca", str(pki.ca_file), "security", "tokens", "create", "--principal", "x"),
        *("--admin-addr", broker.admin_addr),
    )
    assert out.returncode == 1 and "UNAUTHENTICATED" in out.stderr

    await grant(broker, pki, "ops", "cluster-admin", ["ManageCluster"])
    out = mint_cli(broker, pki, ops, "--principal", "someone", "--ttl", "10m")
    assert out.returncode == 0, out.stderr
    claims = jwt.decode(out.stdout.strip().splitlines()[-1], options={"verify_signature": False})
    assert claims["principal_name"] == "someone" and claims["exp"] - claims["iat"] == 600


def test_broker_with_only_public_keys_refuses_to_mint(tmp_path: Path, pki: Pki) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    public = tmp_path / "jwt-public.pem"
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    proc = BrokerProcess(
        tmp_path / "data",
        *("--tls-cert", str(pki.cert_file), "--tls-key", str(pki.key_file), "--superuser", "root"),
        env={"ISTER_SECURITY__AUTH__JWT__PUBLIC_KEY_FILES": f"[{public}]"},
    )
    proc.start()
    try:
        now = int(time.time())
        root = jwt.encode(
            {"sub": "root", "iss": "danube-auth", "iat": now, "exp": now + 600}, key, algorithm="ES256"
        )
        out = mint_cli(proc, pki, root, "--principal", "x", "--ttl", "10m")
        assert out.returncode == 1
        assert "FAILED_PRECONDITION" in out.stderr and "no HS256 secret" in out.stderr
    finally:
        proc.stop()
