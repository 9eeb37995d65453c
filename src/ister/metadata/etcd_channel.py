"""The etcd backend's channel: endpoints (`parse_endpoint`), TLS (`EtcdTls`) and one gRPC channel with the
etcd stubs (`Connection`; aetcd's `Client` only makes plaintext channels), and how a failed connection is
described. `etcd.py`'s `EtcdStore` makes the requests."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import grpc
import grpc.aio
from aetcd import rpc

from ister.errors import InvalidArgument

DEFAULT_PORT = 2379
RECONNECT_BACKOFF_MIN_MS = 100
RECONNECT_BACKOFF_MAX_MS = 1000
# gRPC reads `grpc.min_reconnect_backoff_ms` as the least time one connection attempt gets to finish its
# handshake (TCP, TLS, the HTTP/2 SETTINGS), not as a backoff: at 100 ms an etcd slow to answer a new
# connection (a loaded machine) was never reached (tests/unit/test_etcd_slow_handshake.py). The first retry
# still comes after `initial_reconnect_backoff_ms`.
CONNECT_ATTEMPT_MIN_MS = 5000
KEEPALIVE_TIME_MS = 10_000  # etcd refuses pings more often than every 5 s (--grpc-keepalive-min-time)


@dataclass(frozen=True, slots=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_endpoint(endpoint: str, tls: bool = False) -> Endpoint:
    """'host:port', 'http://host:port', 'https://host:port' or '[v6]:port' (port 2379 when missing).

    A bare 'host:port' is TLS when `tls` is set; `https://` needs `tls` and `http://` refuses it."""
    if not isinstance(endpoint, str) or not endpoint.strip():
        raise InvalidArgument(f"invalid etcd endpoint {endpoint!r}: expected 'host:port'")
    text = endpoint.strip()
    if "://" not in text:
        text = ("https://" if tls else "http://") + text
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise InvalidArgument(f"invalid etcd endpoint {endpoint!r}: {exc}") from exc
    if parts.scheme not in ("http", "https"):
        raise InvalidArgument(f"invalid etcd endpoint {endpoint!r}: expected http:// or https://")
    if parts.scheme == "https" and not tls:
        raise InvalidArgument(
            f"etcd endpoint {endpoint!r} is https:// but no TLS settings were given "
            "(cluster.etcd_tls.ca_file: the CA of etcd's server certificate)"
        )
    if parts.scheme == "http" and tls:
        raise InvalidArgument(
            f"etcd endpoint {endpoint!r} is plaintext http:// but TLS to etcd is configured"
        )
    if not parts.hostname or parts.path not in ("", "/") or parts.query or parts.username:
        raise InvalidArgument(f"invalid etcd endpoint {endpoint!r}: expected 'host:port'")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return Endpoint(host, DEFAULT_PORT if port is None else port)


@dataclass(frozen=True, slots=True)
class EtcdTls:
    """TLS to etcd: the CA of etcd's server certificate, and this client's certificate chain and key (PEM)
    for an etcd that requires client certificates (`--client-cert-auth`). Never logged."""

    ca_pem: bytes
    cert_pem: bytes | None = None
    key_pem: bytes | None = None

    def __repr__(self) -> str:
        return f"EtcdTls(client_certificate={self.cert_pem is not None})"

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca_pem, private_key=self.key_pem, certificate_chain=self.cert_pem
        )


class Connection:
    """One gRPC channel to one endpoint (plaintext, or TLS with `tls`) and the etcd stubs on it."""

    def __init__(self, endpoint: Endpoint, timeout: float, tls: EtcdTls | None = None) -> None:
        self.endpoint = endpoint
        options = {
            "grpc.initial_reconnect_backoff_ms": RECONNECT_BACKOFF_MIN_MS,
            "grpc.min_reconnect_backoff_ms": CONNECT_ATTEMPT_MIN_MS,
            "grpc.max_reconnect_backoff_ms": RECONNECT_BACKOFF_MAX_MS,
            "grpc.keepalive_time_ms": KEEPALIVE_TIME_MS,
            "grpc.keepalive_timeout_ms": max(1000, int(timeout * 1000)),
            "grpc.max_receive_message_length": -1,  # a list is bounded by MAX_LIST_RESULTS, not bytes
        }
        self.target = str(endpoint)
        self.options = list(options.items())
        self.tls = tls
        self.channel: Any = None
        self.kv: Any = None
        self.lease: Any = None
        self.watch: Any = None

    async def open(self) -> None:
        """Create the channel and stubs; no network traffic yet (the first request connects)."""
        if self.tls is not None:
            self.channel = grpc.aio.secure_channel(self.target, self.tls.credentials(), options=self.options)
        else:
            self.channel = grpc.aio.insecure_channel(self.target, options=self.options)
        self.kv = rpc.KVStub(self.channel)
        self.lease = rpc.LeaseStub(self.channel)
        self.watch = rpc.WatchStub(self.channel)

    async def close(self) -> None:
        if self.channel is not None:
            with contextlib.suppress(Exception):
                await self.channel.close()


def connection_hint(error: str, tls: EtcdTls | None) -> str:
    """What to check when the first connection fails in a way that points at TLS settings."""
    text = error.lower()
    if tls is None and ("socket closed" in text or "connection reset" in text or "http2" in text):
        return " (if etcd serves TLS: https:// endpoints and cluster.etcd_tls.ca_file)"
    if tls is not None and any(w in text for w in ("ssl", "tls", "tsi_", "handshake", "certificate")):
        return (
            " (TLS to etcd failed: cluster.etcd_tls.ca_file must be the CA of etcd's server certificate, "
            "whose names must include the endpoint's host; an etcd with --client-cert-auth needs "
            "cluster.etcd_tls.cert_file/key_file signed by its --trusted-ca-file)"
        )
    return ""


def describe_error(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return f"{type(exc).__name__}: {exc}"
