"""The etcd store's connection (etcd.py): endpoints, the connection in use and the move to another, calls
with deadlines and their errors, the revision seen, and the key namespace."""

from __future__ import annotations

import asyncio
import builtins
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Self

import aetcd
import grpc
import grpc.aio
from aetcd import rpc

from ister.errors import InvalidArgument, MetadataError, MetadataUnusable
from ister.limits import METADATA_TIMEOUT_SECONDS
from ister.metadata.etcd_channel import (
    Connection,
    Endpoint,
    EtcdTls,
    connection_hint,
    describe_error,
    parse_endpoint,
)
from ister.metadata.store import (
    KeyValue,
    LeaseNotFound,
    Watch,
    check_key,
    decode_value,
)
from ister.tasks import TaskSupervisor

log = logging.getLogger(__name__)

# gRPC codes that mean "this endpoint is not answering": worth probing the other endpoints.
CONNECTION_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


def range_end(prefix: bytes) -> bytes:
    """The smallest key above every key that starts with `prefix` (prefixes here never end in 0xff only)."""
    data = bytearray(prefix)
    while data:
        if data[-1] < 0xFF:
            data[-1] += 1
            return bytes(data)
        data.pop()
    return b"\x00"  # etcd: "every key >= start"


class EtcdBase:
    """What every part of `EtcdStore` uses: its connection, its calls and its keys."""

    def __init__(
        self, endpoints: builtins.list[Endpoint], namespace: str, timeout: float, tls: EtcdTls | None = None
    ) -> None:
        self._endpoints = endpoints
        self._tls = tls
        self._last_error = ""
        self._namespace = namespace
        self._ns = namespace.encode("utf-8")
        self._timeout = timeout
        self._conn: Connection | None = None
        self._seen_revision = 0  # highest header revision any response has shown this client
        self._cluster_id: int | None = None
        self._watches: dict[Watch, asyncio.Task[None]] = {}
        self._failover_task: asyncio.Task[None] | None = None
        self._tasks = TaskSupervisor("etcd client")  # the watch streams and the endpoint failover
        self._closed = False

    @classmethod
    async def connect(
        cls,
        endpoints: Sequence[str],
        *,
        namespace: str = "",
        timeout: float = METADATA_TIMEOUT_SECONDS,  # noqa: ASYNC109  (a per-request deadline, not a call bound)
        tls: EtcdTls | None = None,
    ) -> Self:
        """Connect to the first endpoint (in order) that answers; `MetadataError` if none does.

        `namespace` ("" or e.g. "/prod": starts with '/', does not end with one) is prepended to every key,
        so several clusters or tests can share one etcd. `timeout` bounds every request. With `tls` every
        endpoint is TLS (bare 'host:port' or 'https://'); without it 'https://' endpoints are refused.
        """
        if isinstance(endpoints, str):
            endpoints = [endpoints]
        parsed = [parse_endpoint(e, tls is not None) for e in endpoints]
        if not parsed:
            raise InvalidArgument("no etcd endpoints given")
        if not isinstance(namespace, str):
            raise InvalidArgument(f"invalid etcd namespace {namespace!r}: expected a string")
        if namespace:
            check_key(namespace, "namespace")
            if namespace.endswith("/"):
                raise InvalidArgument(f"invalid etcd namespace {namespace!r}: must not end with '/'")
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not 0 < timeout < math.inf  # also refuses NaN
        ):
            raise InvalidArgument(f"invalid etcd timeout {timeout!r}: expected a positive number of seconds")
        store = cls(parsed, namespace, float(timeout), tls)
        # Quiet: the error is in what `connect` raises (a starting broker logs one line per attempt).
        conn = await store._connect_first(parsed, logging.DEBUG)
        if conn is None:
            where = ", ".join(f"{'https' if tls else 'http'}://{e}" for e in parsed)
            hint = connection_hint(store._last_error, tls)
            # A hint means TLS settings that do not match etcd's: waiting would not change that.
            error = MetadataUnusable if hint else MetadataError
            raise error(f"cannot reach etcd at {where}: {store._last_error}{hint}")
        store._conn = conn
        return store

    @property
    def endpoint(self) -> str:
        """The endpoint currently in use ('host:port')."""
        return str(self._conn.endpoint) if self._conn is not None else ""

    @property
    def namespace(self) -> str:
        return self._namespace

    # --- connections ------------------------------------------------------------------------------

    async def _connect_first(
        self, candidates: builtins.list[Endpoint], level: int = logging.WARNING
    ) -> Connection | None:
        """A connection to the first candidate that answers a request, or None."""
        for endpoint in candidates:
            conn = Connection(endpoint, self._timeout, self._tls)
            try:
                await conn.open()
                # A real request: proves the endpoint answers and gives the current revision.
                response = await conn.kv.Range(
                    rpc.RangeRequest(key=self._ns or b"/", count_only=True), timeout=self._timeout
                )
            except (grpc.aio.AioRpcError, aetcd.ClientError, OSError) as exc:
                self._last_error = describe_error(exc)
                log.log(level, "etcd endpoint %s did not answer: %s", endpoint, self._last_error)
                await conn.close()
                continue
            except BaseException:
                await conn.close()
                raise
            self._observe(response.header)
            return conn
        return None

    def _current(self) -> Connection:
        if self._closed or self._conn is None:
            raise MetadataError("metadata store is closed")
        return self._conn

    async def _call(self, what: str, request: Callable[[Connection], Awaitable[Any]]) -> Any:
        """Run one request on the current connection; errors become MetadataError (or InvalidArgument)."""
        conn = self._current()
        try:
            response = await request(conn)
        except grpc.aio.AioRpcError as exc:
            raise self._failure(what, conn, exc) from exc
        except (grpc.aio.UsageError, aetcd.ClientError, OSError) as exc:  # e.g. the channel was just closed
            self._maybe_failover(conn)
            raise MetadataError(f"etcd {what} on {conn.endpoint} failed: {describe_error(exc)}") from exc
        header = getattr(response, "header", None)
        if header is not None:
            self._observe(header)
        return response

    def _failure(
        self, what: str, conn: Connection, exc: grpc.aio.AioRpcError
    ) -> MetadataError | InvalidArgument:
        code, details = exc.code(), exc.details() or ""
        if code == grpc.StatusCode.NOT_FOUND and "lease not found" in details:
            return LeaseNotFound(f"lease not found (expired or revoked): {details}")
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            return InvalidArgument(f"etcd refused the {what}: {details}")
        if code in CONNECTION_CODES:
            self._maybe_failover(conn)
        return MetadataError(f"etcd {what} on {conn.endpoint} failed: {describe_error(exc)}")

    def _observe(self, header: Any) -> None:
        cluster_id, revision = int(header.cluster_id), int(header.revision)
        if cluster_id != self._cluster_id:
            if self._cluster_id is not None:
                log.warning("etcd cluster id changed (%s -> %s)", self._cluster_id, cluster_id)
            self._cluster_id = cluster_id
            self._seen_revision = revision
        elif revision > self._seen_revision:
            self._seen_revision = revision

    def _maybe_failover(self, failed: Connection) -> None:
        """With several endpoints, look for one that answers (in the background)."""
        if len(self._endpoints) < 2 or self._closed or failed is not self._conn:
            return
        if self._failover_task is None or self._failover_task.done():
            self._failover_task = self._tasks.spawn(self._failover(failed), "etcd-failover")

    async def _failover(self, failed: Connection) -> None:
        # The failed endpoint first: if it answers again (a restart), stay on it.
        order = [failed.endpoint] + [e for e in self._endpoints if e != failed.endpoint]
        conn = await self._connect_first(order)
        if conn is None or self._closed or self._conn is not failed:
            if conn is not None:
                await conn.close()
            return
        if conn.endpoint == failed.endpoint:
            await conn.close()  # the old channel reconnects by itself
            return
        log.warning("etcd endpoint %s failed; switching to %s", failed.endpoint, conn.endpoint)
        self._conn = conn
        await failed.close()  # its watch streams fail; their consumers watch again on the new connection

    # --- key encoding -----------------------------------------------------------------------------

    def _key(self, key: str) -> bytes:
        return self._ns + key.encode("utf-8")

    def _user_key(self, raw: bytes) -> str:
        try:
            return raw[len(self._ns) :].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MetadataError(f"etcd key {raw!r} is not valid UTF-8") from exc

    def _key_value(self, kv: Any) -> KeyValue:
        key = self._user_key(kv.key)
        return KeyValue(key, decode_value(kv.value, key), int(kv.mod_revision))

    @property
    def revision(self) -> int:
        """The highest etcd revision this client has seen in a response."""
        return self._seen_revision
