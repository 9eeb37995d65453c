"""JWT authentication and default-deny RBAC against a real broker: every RPC of every service refuses
missing, expired, forged and wrong-audience tokens (UNAUTHENTICATED) and callers without a permission
(PERMISSION_DENIED); roles and bindings made through SecurityAdmin let the official client (with_token)
produce and consume; a consumer acks only on its own subscriptions; refusals are audited."""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import danube
import grpc
import pytest
from danube.proto import DanubeApi_pb2 as pb

from ister.security.tokens import mint
from ister.server.auth_rules import RULES
from ister.wire.gen import DanubeAdmin_pb2 as apb
from ister.wire.gen import DanubeAdmin_pb2_grpc as apb_grpc
from tests.integration.forkserver import run_ister
from tests.integration.harness import BrokerProcess, consumer, producer, take
from tests.integration.security_support import Pki, make_pki, secret_file, token

pytestmark = pytest.mark.integration

AUDIENCE = "ister-test"
SERVER_STREAMS = {"/danube.ConsumerService/ReceiveMessages", "/ister.v1.Ister/Read"}
BIDI_STREAMS = {"/ister.v1.Ister/Publish", "/ister.v1.Ister/Consume"}
AUTHN_ONLY = {"/danube.HealthCheck/HealthCheck", "/danube.ConsumerService/ReceiveMessages"}
# Needs no credentials: the API key in the request is the credential (an empty one: UNAUTHENTICATED).
PUBLIC = {"/ister.v1.Ister/ExchangeApiKey"}
# Between brokers only: a client's credentials, even a superuser's, are not peer credentials.
PEER_ONLY = {"/ister.v1.IsterReplica/Replicate"}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[BrokerProcess]:
    base = tmp_path_factory.mktemp("auth")
    proc = BrokerProcess(
        base / "data",
        *("--tls-cert", str(pki.cert_file), "--tls-key", str(pki.key_file)),
        *("--auth-jwt-secret-file", str(secret_file(base)), "--superuser", "root"),
        env={
            "ISTER_SECURITY__AUTH__JWT__AUDIENCE": AUDIENCE,
            "ISTER_SECURITY__AUDIT__MAX_LINES_PER_SECOND": "100000",  # every refusal of the table shows
        },
    )
    proc.start()
    yield proc
    proc.stop()


def tok(principal: str, ttl: int = 3600) -> str:
    return token(principal, ttl, audience=AUDIENCE)


async def _frames() -> AsyncIterator[bytes]:
    yield b""


async def call(ch: Any, method: str, metadata: list[tuple[str, str]]) -> grpc.StatusCode:
    """Call `method` with an empty request; the status it ends with."""
    try:
        if method in SERVER_STREAMS:
            async for _ in ch.unary_stream(method)(b"", metadata=metadata, timeout=5):
                pass
        elif method in BIDI_STREAMS:
            async for _ in ch.stream_stream(method)(_frames(), metadata=metadata, timeout=5):
                pass
        else:
            await ch.unary_unary(method)(b"", metadata=metadata, timeout=5)
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def channel(broker: BrokerProcess, pki: Pki, admin: bool) -> Any:
    creds = grpc.ssl_channel_credentials(pki.ca_file.read_bytes())
    return grpc.aio.secure_channel(broker.admin_addr if admin else f"127.0.0.1:{broker.port}", creds)


def on_admin_port(method: str) -> bool:
    return method.startswith(("/danube_admin.", "/ister.v1.IsterAdmin/"))


def bearer(t: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {t}")]


BAD_TOKENS = {
    "missing": [],
    "expired": bearer(mint(b"test-secret-0123456789abcdef-0123456789", "app", 1, audience=AUDIENCE, now=1e9)),
    "forged": bearer(mint(b"another-secret-0123456789abcdef", "root", 3600, audience=AUDIENCE)),
    "wrong-audience": bearer(
        mint(b"test-secret-0123456789abcdef-0123456789", "root", 3600, audience="other")
    ),
    "no-audience": bearer(mint(b"test-secret-0123456789abcdef-0123456789", "root", 3600)),
    "not-bearer": [("authorization", "Basic cm9vdDpyb290")],
    "garbage": bearer("not.a.jwt"),
}


@pytest.mark.parametrize("case", sorted(BAD_TOKENS))
async def test_every_rpc_refuses_bad_credentials(broker: BrokerProcess, pki: Pki, case: str) -> None:
    wrong = {}
    for admin in (False, True):
        async with channel(broker, pki, admin) as ch:
            for method in RULES:
                if on_admin_port(method) != admin:
                    continue
                code = await call(ch, method, BAD_TOKENS[case])
                if code != grpc.StatusCode.UNAUTHENTICATED:
                    wrong[method] = code
    assert wrong == {}


async def test_every_rpc_denies_a_principal_without_roles(broker: BrokerProcess, pki: Pki) -> None:
    got = {}
    for admin in (False, True):
        async with channel(broker, pki, admin) as ch:
            for method in RULES:
                if on_admin_port(method) == admin:
                    got[method] = await call(ch, method, bearer(tok("nobody")))
    denied = {m for m, c in got.items() if c == grpc.StatusCode.PERMISSION_DENIED}
    assert denied == set(RULES) - AUTHN_ONLY - PUBLIC - PEER_ONLY
    assert {got[m] for m in PUBLIC} == {grpc.StatusCode.UNAUTHENTICATED}  # no API key in the request
    assert {got[m] for m in PEER_ONLY} == {grpc.StatusCode.UNAUTHENTICATED}
    assert got["/danube.HealthCheck/HealthCheck"] == grpc.StatusCode.OK
    assert got["/danube.ConsumerService/ReceiveMessages"] == grpc.StatusCode.NOT_FOUND
    assert "audit principal=service_account:nobody" in broker.log_path.read_text()


async def test_superuser_passes_every_check(broker: BrokerProcess, pki: Pki) -> None:
    refused = {}
    for admin in (False, True):
        async with channel(broker, pki, admin) as ch:
            for method in RULES:
                if on_admin_port(method) == admin and method not in PUBLIC:
                    code = await call(ch, method, bearer(tok("root")))
                    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                        refused[method] = code
    assert refused == dict.fromkeys(PEER_ONLY, grpc.StatusCode.UNAUTHENTICATED)


async def _grant(
    broker: BrokerProcess, pki: Pki, principal: str, role: str, perms: list[str], scope: str, res: str
) -> None:
    async with channel(broker, pki, True) as ch:
        sec = apb_grpc.SecurityAdminStub(ch)
        md = bearer(tok("root"))
        await sec.CreateRole(
            apb.CreateRoleRequest(role=apb.RoleDefinition(name=role, permissions=perms)), metadata=md
        )
        binding = apb.BindingDefinition(
            id=f"{principal}-{role}",
            principal_type="service_account",
            principal_name=principal,
            role_names=[role],
            scope=scope,
            resource_name=res,
        )
        await sec.CreateBinding(apb.CreateBindingRequest(binding=binding), metadata=md)


async def _client(broker: BrokerProcess, pki: Pki, principal: str) -> danube.DanubeClient:
    url = f"https://127.0.0.1:{broker.port}"
    return (
        await danube.DanubeClientBuilder()
        .service_url(url)
        .with_tls(str(pki.ca_file))
        .with_token(tok(principal))
        .build()
    )


async def test_official_client_with_token_and_bindings(broker: BrokerProcess, pki: Pki) -> None:
    await _grant(broker, pki, "app", "app-rw", ["Lookup", "Produce", "Consume"], "topic", "/default/orders-*")
    client = await _client(broker, pki, "app")
    topic = "/default/orders-eu"
    prod = await producer(client, topic, "p", reliable=True)
    cons, queue = await consumer(client, topic, "c", "s", danube.SubType.SHARED)
    for i in range(3):
        await prod.send(f"m{i}".encode(), None)
    assert [m.payload for m in await take(queue, 3, ack=cons)] == [b"m0", b"m1", b"m2"]

    # Outside the pattern: refused, and the refusal says what is missing.
    creds = grpc.ssl_channel_credentials(pki.ca_file.read_bytes())
    async with grpc.aio.secure_channel(f"127.0.0.1:{broker.port}", creds) as ch:
        req = pb.ProducerRequest(request_id=1, producer_name="x", topic_name="/default/payments")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await ch.unary_unary("/danube.ProducerService/CreateProducer")(
                req.SerializeToString(), metadata=bearer(tok("app")), timeout=5
            )
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "permission Produce on topic:/default/payments" in (err.value.details() or "")

        # Another principal allowed to consume the topic still cannot ack on app's subscription.
        await _grant(broker, pki, "eve", "eve-c", ["Consume"], "topic", "/default/orders-eu")
        ack = pb.AckRequest(
            request_id=1, msg_id=pb.MsgID(topic_name=topic, topic_offset=0), subscription_name="s"
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await ch.unary_unary("/danube.ConsumerService/Ack")(
                ack.SerializeToString(), metadata=bearer(tok("eve")), timeout=5
            )
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "acks only its own deliveries" in (err.value.details() or "")
        # ... while app, which has a consumer there, may.
        await ch.unary_unary("/danube.ConsumerService/Ack")(
            ack.SerializeToString(), metadata=bearer(tok("app")), timeout=5
        )
    await cons.close()
    log = broker.log_path.read_text()
    assert "action=SecurityAdmin.CreateBinding" in log and "result=ok" in log
    assert SECRET_TEXT not in log and tok("app") not in log


SECRET_TEXT = "test-secret-0123456789abcdef"


async def test_official_client_without_permission_is_refused(
    broker: BrokerProcess, pki: Pki, tmp_path: Path
) -> None:
    client = await _client(broker, pki, "stranger")
    prod = client.new_producer().with_topic("/default/locked").with_name("p").build()
    with pytest.raises(Exception) as err:
        await prod.create()
    assert "PERMISSION_DENIED" in str(err.value) or "permission" in str(err.value).lower()


def _ister(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_ister(list(args), timeout=60, env={**os.environ, **(env or {})})


async def test_cli_tokens_roles_bindings_and_produce(broker: BrokerProcess, pki: Pki, tmp_path: Path) -> None:
    secret = secret_file(tmp_path)
    minted = _ister(
        *("admin", "security", "tokens", "create", "--principal", "root", "--ttl", "10m"),
        *("--secret-file", str(secret), "--audience", AUDIENCE),
    )
    assert minted.returncode == 0, minted.stderr
    root = minted.stdout.strip().splitlines()[-1]
    sec = ("admin", "--token", root, "--tls-ca", str(pki.ca_file), "security")
    addr = ("--admin-addr", broker.admin_addr)
    out = _ister(*sec, "roles", "create", "cli-producer", "--permissions", "Produce,Lookup", *addr)
    assert out.returncode == 0, out.stderr
    out = _ister(
        *sec,
        "bindings",
        "create",
        "cli-b",
        "--principal-name",
        "cli-app",
        "--roles",
        "cli-producer",
        *("--scope", "namespace", "--resource", "default"),
        *addr,
    )
    assert out.returncode == 0, out.stderr
    listed = _ister(*sec, "bindings", "list", *addr)
    assert "cli-app" in listed.stdout
    # Without a token the admin API refuses, with a clear message.
    out = _ister("admin", "--tls-ca", str(pki.ca_file), "security", "roles", "list", *addr)
    assert out.returncode == 1 and "UNAUTHENTICATED" in out.stderr
    # `ister produce` with ISTER_TOKEN from the environment.
    app_token = minted_token = tok("cli-app")
    out = _ister(
        "produce",
        "-s",
        f"https://127.0.0.1:{broker.port}",
        "-t",
        "/default/cli_secure",
        "-m",
        "hello",
        "--tls-ca",
        str(pki.ca_file),
        env={"ISTER_TOKEN": app_token},
    )
    assert out.returncode == 0, out.stderr
    assert minted_token not in out.stdout + out.stderr
