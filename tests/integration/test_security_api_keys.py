"""API keys against a real broker (TLS, HS256, tokens of 3 s without leeway): created, listed and revoked with
`ister admin security api-keys`, exchanged by the Ister client (`api_key=`, ISTER_API_KEY) for tokens that
it refreshes before they expire; wrong and revoked keys refused; the secret stored only hashed and never
logged."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import jwt
import pytest

from ister import errors
from ister.client.client import Client
from ister.wire.gen import ister_v1_pb2 as ipb
from ister.wire.gen import ister_v1_pb2_grpc as ipb_grpc
from tests.integration.forkserver import run_ister
from tests.integration.harness import ISTER, BrokerProcess
from tests.integration.security_support import Pki, make_pki, secret_file, token
from tests.support import until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
TTL = 3


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[BrokerProcess]:
    base = tmp_path_factory.mktemp("api-keys")
    proc = BrokerProcess(
        base / "data",
        *("--tls-cert", str(pki.cert_file), "--tls-key", str(pki.key_file)),
        *("--auth-jwt-secret-file", str(secret_file(base)), "--superuser", "root"),
        env={
            "ISTER_SECURITY__AUTH__API_KEYS__TOKEN_TTL_SECONDS": str(TTL),
            "ISTER_SECURITY__AUTH__JWT__LEEWAY_SECONDS": "0",
        },
    )
    proc.start()
    yield proc
    proc.stop()


def ister(broker: BrokerProcess, pki: Pki, *args: str) -> subprocess.CompletedProcess[str]:
    """`ister admin security api-keys ...` as root."""
    return run_ister(
        [
            *("admin", "--token", token("root"), "--tls-ca", str(pki.ca_file), "security", "api-keys"),
            *args,
            *("--admin-addr", broker.admin_addr),
        ],
        timeout=60,
    )


def create_key(broker: BrokerProcess, pki: Pki, principal: str) -> str:
    out = ister(broker, pki, "create", "--principal", principal, "--description", "test key")
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def url(broker: BrokerProcess) -> str:
    return f"https://127.0.0.1:{broker.port}"


async def test_create_list_and_the_secret_stored_hashed(broker: BrokerProcess, pki: Pki) -> None:
    key = create_key(broker, pki, "lister")
    key_id = key.split("_")[1]
    listed = ister(broker, pki, "list")
    assert listed.returncode == 0, listed.stderr
    entries = {e["id"]: e for e in json.loads(listed.stdout)}
    assert entries[key_id]["principal_name"] == "lister"
    assert entries[key_id]["description"] == "test key"
    secret = key.split("_", 2)[2]
    assert secret not in listed.stdout
    stored = b"".join(p.read_bytes() for p in broker.data_dir.rglob("*") if p.is_file())
    assert secret.encode() not in stored
    assert key_id.encode() in stored  # the record is there, under its id
    assert secret not in broker.log()
    # Without credentials the admin RPCs are refused like every other.
    creds = grpc.ssl_channel_credentials(pki.ca_file.read_bytes())
    async with grpc.aio.secure_channel(broker.admin_addr, creds) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await ipb_grpc.IsterAdminStub(ch).ListApiKeys(ipb.ListApiKeysRequest(), timeout=10)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_exchange_gives_a_short_lived_token_of_the_principal(broker: BrokerProcess, pki: Pki) -> None:
    key = create_key(broker, pki, "root")
    creds = grpc.ssl_channel_credentials(pki.ca_file.read_bytes())
    async with grpc.aio.secure_channel(f"127.0.0.1:{broker.port}", creds) as ch:
        stub = ipb_grpc.IsterStub(ch)
        resp = await stub.ExchangeApiKey(ipb.ExchangeApiKeyRequest(api_key=key, ttl_seconds=3600), timeout=10)
        claims = jwt.decode(resp.token, options={"verify_signature": False})
        assert claims["principal_name"] == "root" and resp.principal == "service_account:root"
        assert claims["exp"] - claims["iat"] == TTL  # capped at the broker's token_ttl_seconds
        assert resp.expires_at_ms == claims["exp"] * 1000
        # The token works as a bearer token: past authentication (the topic does not exist), unlike no token.
        for metadata, expected in (
            ([("authorization", f"Bearer {resp.token}")], grpc.StatusCode.NOT_FOUND),
            ([], grpc.StatusCode.UNAUTHENTICATED),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as looked_up:
                await stub.Lookup(ipb.LookupRequest(topic="/default/nothing_here"), metadata=metadata)
            assert looked_up.value.code() == expected
        for bad in ("", "ister_0123456789abcdef_" + "x" * 43, key[:-2] + "zz", key + "x"):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.ExchangeApiKey(ipb.ExchangeApiKeyRequest(api_key=bad), timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "invalid API key" in (refused.value.details() or "")
    assert key not in broker.log()


async def test_client_exchanges_refreshes_and_a_revoked_key_is_refused(
    broker: BrokerProcess, pki: Pki
) -> None:
    key = create_key(broker, pki, "root")
    topic = "/default/keyed_refresh"
    async with Client(url(broker), api_key=key, tls_ca=str(pki.ca_file)) as client:
        session = client.api_key_session
        assert session is not None and session.principal == "service_account:root"
        assert key not in repr(client.credentials) and key not in repr(session)
        first_exp = session.expires_at
        producer = await client.producer(topic, "keyed")
        await producer.send(b"before")
        # Refreshed in the background before it expires; calls made after the first token's exp still pass.
        await until(lambda: session.exchanges >= 2, "the token refreshed", within=TTL * 3)
        await until(lambda: time.time() > first_exp + 0.5, "the first token expired", within=TTL * 3)
        await producer.send(b"after-first-expiry")
        async with Client(url(broker), token=token("root"), tls_ca=str(pki.ca_file)) as reader:
            got = [p for batch in [b async for b in reader.read(topic, 0, 2)] for _, p in batch]
        assert len(got) == 2

    # Revoked: the next exchange is refused (a client connecting with it fails at once).
    key_id = key.split("_")[1]
    out = ister(broker, pki, "revoke", key_id)
    assert out.returncode == 0, out.stderr
    with pytest.raises(errors.Unauthenticated, match="invalid API key"):
        await Client(url(broker), api_key=key, tls_ca=str(pki.ca_file)).connect()
    assert ister(broker, pki, "revoke", key_id).returncode == 1  # NOT_FOUND now


def test_ister_api_key_environment_variable(broker: BrokerProcess, pki: Pki, tmp_path: Path) -> None:
    key = create_key(broker, pki, "root")
    env = {k: v for k, v in os.environ.items() if k not in ("ISTER_TOKEN",)}
    command = [*ISTER, "produce", "-s", url(broker), "-t", "/default/keyed_env", "-m", "hello"]
    command += ["--tls-ca", str(pki.ca_file)]
    out = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "ISTER_API_KEY": key},
    )
    assert out.returncode == 0, out.stderr
    assert key not in out.stdout + out.stderr
    wrong = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "ISTER_API_KEY": key[:-3] + "abc"},
    )
    assert wrong.returncode != 0 and "invalid API key" in wrong.stderr


def test_ister_admin_takes_an_api_key(broker: BrokerProcess, pki: Pki) -> None:
    """`ister admin --api-key` / ISTER_API_KEY: exchanged at the admin port (ExchangeApiKey is served there
    too), the token then authenticates the admin calls; a token wins over a key; a wrong key is refused."""
    key = create_key(broker, pki, "root")
    env = {k: v for k, v in os.environ.items() if k not in ("ISTER_TOKEN", "ISTER_API_KEY")}
    listing = ("security", "api-keys", "list", "--admin-addr", broker.admin_addr)

    def admin(*args: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        command = [*ISTER, "admin", "--tls-ca", str(pki.ca_file), *args]
        return subprocess.run(
            command, capture_output=True, text=True, timeout=60, env={**env, **(extra_env or {})}
        )

    by_flag = admin("--api-key", key, *listing)
    assert by_flag.returncode == 0, by_flag.stderr
    assert key.split("_")[1] in {e["id"] for e in json.loads(by_flag.stdout)}
    by_env = admin(*listing, extra_env={"ISTER_API_KEY": key})
    assert by_env.returncode == 0, by_env.stderr
    assert key not in by_flag.stdout + by_flag.stderr + by_env.stdout + by_env.stderr

    wrong = admin("--api-key", key[:-3] + "abc", *listing)
    assert wrong.returncode == 1
    assert "exchanging the API key: invalid API key" in wrong.stderr and "UNAUTHENTICATED" in wrong.stderr
    # A token (flag or ISTER_TOKEN) wins over the key: a wrong key is then never exchanged.
    with_token = admin("--token", token("root"), "--api-key", "wrong", *listing)
    assert with_token.returncode == 0, with_token.stderr
    # The admin port serves no other method of ister.v1.Ister.
    channel = grpc.secure_channel(broker.admin_addr, grpc.ssl_channel_credentials(pki.ca_file.read_bytes()))
    with channel, pytest.raises(grpc.RpcError) as unbound:
        ipb_grpc.IsterStub(channel).Lookup(
            ipb.LookupRequest(topic="/default/x"),
            metadata=[("authorization", f"Bearer {token('root')}")],
            timeout=10,
        )
    assert unbound.value.code() == grpc.StatusCode.UNIMPLEMENTED  # type: ignore[attr-defined]
