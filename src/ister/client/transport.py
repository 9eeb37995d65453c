"""The peer transport: how any part of Ister reaches a broker over gRPC.

The client, brokers talking to each other (a follower fetching from its leader, stats forwarded to a
topic's owner, replica and cluster peers with their shared secret), the CLI and the Spark connector open
their channels and name their credentials here, so that gRPC's channel settings and TLS rules have one home
and nothing outside `wire`, `server` and `client` needs grpc for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from ister.limits import GRPC_MAX_MESSAGE_BYTES

if TYPE_CHECKING:
    from ister.client.api_key import ApiKeySession

CONNECT_ATTEMPT_MIN_MS = 5_000  # as the etcd channel's (metadata/etcd_channel.py)

CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_receive_message_length", GRPC_MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", GRPC_MAX_MESSAGE_BYTES),
    # Detect a dead broker on an open stream (the broker allows pings every 5 s or more).
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.http2.max_pings_without_data", 0),
    # Any ping (gRPC's own bandwidth probes too) unanswered this long ends the connection: a keepalive ping
    # is never sent while another is outstanding, so with the default 60 s a probe sent just as the broker
    # froze kept a stopped broker's stream open past the ack deadline (45 s).
    ("grpc.http2.ping_timeout_ms", 5_000),
    # Our own loops retry with backoff; gRPC's reconnect backoff (default up to 120 s) must not stack on it.
    # The first retry of a refused connection comes after 100 ms.
    ("grpc.initial_reconnect_backoff_ms", 100),
    # gRPC reads this as the least time one connection attempt gets for TCP, TLS and the HTTP/2 SETTINGS
    # exchange, not as a backoff: at 100 ms a broker slower than the 2 s maximum backoff to answer a new
    # connection (long round trips, TLS, load) was never reached. Callers' deadlines still bound the wait.
    ("grpc.min_reconnect_backoff_ms", CONNECT_ATTEMPT_MIN_MS),
    ("grpc.max_reconnect_backoff_ms", 2_000),
    ("grpc.enable_retries", 0),
]


TOKEN_ENV = "ISTER_TOKEN"  # a bearer token (JWT) for every call
TLS_CA_ENV = "ISTER_TLS_CA"  # PEM file of the CA that signed the brokers' certificates


@dataclass(frozen=True, slots=True)
class Credentials:
    """How a client proves who it is and checks the broker: a bearer token (JWT) sent on every call, the
    CA that signed the broker's certificate (`tls_ca`, PEM file; system roots when unset), and a client
    certificate for mutual TLS. A token or CA means TLS whatever the URL's scheme (a token never travels
    in cleartext)."""

    token: str | None = None
    tls_ca: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    # An API key exchanged for tokens (client/api_key.py): its current token goes on every call.
    session: ApiKeySession | None = None

    @property
    def tls(self) -> bool:
        return bool(self.token or self.tls_ca or self.cert_file or self.session)

    def channel_credentials(self) -> Any:
        def read(path: str | None) -> bytes | None:
            if path is None:
                return None
            with open(path, "rb") as f:
                return f.read()

        creds = grpc.ssl_channel_credentials(read(self.tls_ca), read(self.key_file), read(self.cert_file))
        if self.token:
            creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(self.token))
        elif self.session is not None:
            creds = grpc.composite_channel_credentials(creds, grpc.metadata_call_credentials(self.session))
        return creds

    def __repr__(self) -> str:  # never shows the token
        return f"Credentials(token={'***' if self.token else None}, tls_ca={self.tls_ca!r})"


NO_CREDENTIALS = Credentials()


def split_url(url: str) -> tuple[str, bool]:
    """(`host:port`, https?) of a service URL."""
    for scheme, tls in (("https://", True), ("http://", False)):
        if url.startswith(scheme):
            return url[len(scheme) :].rstrip("/"), tls
    return url.rstrip("/"), False


def open_channel(url: str, credentials: Credentials = NO_CREDENTIALS) -> Any:
    """A grpc.aio channel for `http://host:port` (plain) or `https://host:port` (TLS: system roots unless
    `credentials` names a CA); with a token or CA in `credentials`, TLS whatever the scheme."""
    target, https = split_url(url)
    if https or credentials.tls:
        return grpc.aio.secure_channel(target, credentials.channel_credentials(), options=CHANNEL_OPTIONS)
    return grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)


def open_blocking_channel(url: str, credentials: Credentials = NO_CREDENTIALS) -> Any:
    """`open_channel` for callers without an event loop (the Spark driver): a blocking grpc channel, a
    context manager that closes it. The same options: a topic listing of 100,000 topics is over gRPC's
    default 4 MiB receive limit."""
    target, https = split_url(url)
    if https or credentials.tls:
        return grpc.secure_channel(target, credentials.channel_credentials(), options=CHANNEL_OPTIONS)
    return grpc.insecure_channel(target, options=CHANNEL_OPTIONS)


RpcError = grpc.RpcError  # what a blocking call raises: `.code()` and `.details()` say why
AioRpcError = grpc.aio.AioRpcError  # what an asyncio call or stream raises
END_OF_STREAM = grpc.aio.EOF  # what `read()` of a stream returns once the peer ended it
