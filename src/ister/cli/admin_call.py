"""The admin CLI's connection to a broker: the address, the channel (plaintext, TLS, a token or an API key),
one call with its failure printed as `error: <message>` and exit 1."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

import grpc
import typer

from ister.cli.security_opts import api_key, current
from ister.client.transport import TOKEN_ENV, Credentials
from ister.config import split_host_port
from ister.errors import ConfigError
from ister.wire.gen import DanubeAdmin_pb2_grpc as pb_grpc
from ister.wire.gen import ister_v1_pb2 as ister_pb
from ister.wire.gen import ister_v1_pb2_grpc as ister_pb_grpc

DEFAULT_ADMIN_ADDR = "127.0.0.1:50051"
ADMIN_ADDR_ENV = "ISTER_ADMIN_ADDR"
CALL_TIMEOUT_SECONDS = 30.0

T = TypeVar("T")


class AdminCallError(Exception):
    """A failed admin call, with the message the CLI prints."""


@dataclass
class Stubs:
    topics: Any
    namespaces: Any
    brokers: Any
    security: Any = None
    ister_admin: Any = None  # ister.v1.IsterAdmin: API keys


def target_of(addr: str) -> str:
    """`HOST:PORT` from `HOST:PORT` or `http://HOST:PORT`; a usage error otherwise."""
    raw = addr.strip()
    for scheme in ("http://", "grpc://", "https://"):
        if raw.startswith(scheme):
            raw = raw[len(scheme) :]
    raw = raw.rstrip("/")
    if "://" in raw:
        raise typer.BadParameter(f"{addr!r}: use HOST:PORT, http:// or https://", param_hint="--admin-addr")
    try:
        host, port = split_host_port(raw, "--admin-addr")
    except ConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint="--admin-addr") from None
    return f"{host}:{port}"


def describe_rpc_error(exc: grpc.RpcError, addr: str) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    text = (details or "").lower()
    # The channel's own failure names the admin port; a broker's UNAVAILABLE answer (etcd down, say) may
    # also say "failed to connect", about something else, and is shown as the broker wrote it.
    port = addr.rpartition(":")[2]
    if (
        code == grpc.StatusCode.UNAVAILABLE
        and ("connect" in text or "refused" in text)
        and f":{port}" in text
    ):
        return (
            f"cannot reach the admin API at {addr}: connection refused or unreachable "
            f"(is the broker running with --admin-addr {addr}? set --admin-addr or {ADMIN_ADDR_ENV})"
        )
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"the admin API at {addr} did not answer within {CALL_TIMEOUT_SECONDS:.0f} s"
    name = code.name if code is not None else "UNKNOWN"
    return f"{details} ({name})"


@contextmanager
def connect(addr: str) -> Iterator[Stubs]:
    target = target_of(addr)
    channel = admin_channel(addr, target)
    try:
        yield Stubs(
            pb_grpc.TopicAdminStub(channel),
            pb_grpc.NamespaceAdminStub(channel),
            pb_grpc.BrokerAdminStub(channel),
            pb_grpc.SecurityAdminStub(channel),
            ister_pb_grpc.IsterAdminStub(channel),
        )
    except grpc.RpcError as exc:
        raise AdminCallError(describe_rpc_error(exc, target)) from None
    finally:
        channel.close()


def exchange_api_key(key: str, target: str) -> None:
    """Exchange the API key for a token at the admin port (`Ister.ExchangeApiKey`, over TLS); the token
    then serves every call of this process (and its children). Prints the error and exits 1 on failure."""
    channel = grpc.secure_channel(target, Credentials(tls_ca=current().tls_ca).channel_credentials())
    try:
        resp = ister_pb_grpc.IsterStub(channel).ExchangeApiKey(
            ister_pb.ExchangeApiKeyRequest(api_key=key), timeout=CALL_TIMEOUT_SECONDS
        )
    except grpc.RpcError as exc:
        fail(f"exchanging the API key: {describe_rpc_error(exc, target)}")
    finally:
        channel.close()
    os.environ[TOKEN_ENV] = resp.token


def admin_channel(addr: str, target: str) -> Any:
    """Plaintext, or TLS for an https:// address, a --tls-ca, a --token or an --api-key (exchanged for a
    token first; both need TLS)."""
    key = api_key()
    if key:
        exchange_api_key(key, target)
    creds = current()
    if creds.tls or addr.strip().startswith("https://"):
        return grpc.secure_channel(target, creds.channel_credentials())
    return grpc.insecure_channel(target)


def call_admin(addr: str, service: str, method: str, request: Any) -> Any:
    """One admin RPC (`service` names a field of `Stubs`); failures print `error: ...` and exit 1."""
    return call(addr, lambda s: getattr(getattr(s, service), method)(request, timeout=CALL_TIMEOUT_SECONDS))


def call(addr: str, fn: Callable[[Stubs], T]) -> T:
    """Run `fn` against the admin API; print `error: ...` and exit 1 when it fails."""
    try:
        with connect(addr) as stubs:
            return fn(stubs)
    except AdminCallError as exc:
        fail(str(exc))


def fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(1)


def topic_name(raw: str) -> str:
    """`/ns/topic`; `ns/topic` is accepted too (the broker validates the rest)."""
    raw = raw.strip()
    return raw if raw.startswith("/") else f"/{raw}"
