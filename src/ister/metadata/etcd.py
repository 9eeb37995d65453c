"""`EtcdStore`: the clustered metadata backend, on an etcd v3 server through `aetcd`.

The gRPC channel is made here, plaintext or TLS (`EtcdTls`; aetcd's `Client` only makes plaintext channels),
with the stubs of `aetcd.rpc`; requests are built here from its messages because aetcd's high-level helpers
hide what the contract needs (range limits and counts, the response header revision, watch start revisions
and stream errors, per-call deadlines).

* Keys are stored as `namespace + key` (UTF-8); the default namespace "" keeps the key layout unchanged.
  Values are the JSON of `store.encode_value`.
* `KeyValue.version` and `WatchEvent.revision` are etcd mod revisions: global and increasing, as the
  contract asks, and they survive etcd restarts because etcd persists them.
* Every call has a deadline (`timeout`); gRPC and connection failures become `MetadataError` (retriable).
  The gRPC channel reconnects by itself with a short backoff (at most `RECONNECT_BACKOFF_MAX_MS`), so after an
  etcd restart on the same address calls work again without help. With several endpoints, a failed
  connection also makes the store probe the endpoints (in order) and move to one that answers.
* A `Watch` is one etcd watch stream, started at the highest revision this client has seen + 1, so it reports
  every change made after `watch()` returned (and possibly a few older ones, which consumers skip by
  revision). A broken stream fails the watch with `MetadataError` (compaction: `WatchLagged`); the consumer
  re-lists and watches again.
* Leases: TTLs are rounded up to whole seconds and etcd raises them to its minimum (2 s with the default
  election timeout of 1 s: ceil(1.5 x election timeout)). aetcd sends no keep-alives on its own: callers call
  `keep_alive`. After an etcd restart the surviving leases start their TTL afresh (etcd's rule).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aetcd
import grpc
import grpc.aio
from aetcd import rpc

from ister.errors import InvalidArgument, MetadataError, MetadataUnusable, WatchLagged
from ister.limits import METADATA_TIMEOUT_SECONDS
from ister.metadata.etcd_channel import (
    Connection,
    Endpoint,
    connection_hint,
    describe_error,
)
from ister.metadata.etcd_channel import EtcdTls as EtcdTls  # re-exported: callers name it from here
from ister.metadata.etcd_channel import parse_endpoint as parse_endpoint
from ister.metadata.store import (
    DEFAULT_WATCH_QUEUE,
    Compare,
    KeyValue,
    LeaseNotFound,
    ListTooLarge,
    Op,
    Watch,
    WatchEvent,
    check_key,
    check_limit,
    decode_value,
    encode_value,
)
from ister.metadata.txn import check_txn, check_version

log = logging.getLogger(__name__)

MAX_LEASE_TTL_SECONDS = 365 * 24 * 3600.0
MAX_LEASE_ID = 2**63 - 1  # etcd lease ids are positive int64

# gRPC codes that mean "this endpoint is not answering": worth probing the other endpoints.
_CONNECTION_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


def _range_end(prefix: bytes) -> bytes:
    """The smallest key above every key that starts with `prefix` (prefixes here never end in 0xff only)."""
    data = bytearray(prefix)
    while data:
        if data[-1] < 0xFF:
            data[-1] += 1
            return bytes(data)
        data.pop()
    return b"\x00"  # etcd: "every key >= start"


def _check_lease_id(lease_id: object) -> int:
    if isinstance(lease_id, bool) or not isinstance(lease_id, int):
        raise InvalidArgument(f"invalid lease id {lease_id!r}")
    return lease_id


def _lease_exists(lease_id: int) -> bool:
    """False for ids etcd can never have granted (so no request is needed to know it is not found)."""
    return 0 < lease_id <= MAX_LEASE_ID


class EtcdStore:
    """The etcd `MetadataStore` (see the module docstring). Create it with `await EtcdStore.connect(...)`."""

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
        self._closed = False

    @classmethod
    async def connect(
        cls,
        endpoints: Sequence[str],
        *,
        namespace: str = "",
        timeout: float = METADATA_TIMEOUT_SECONDS,  # noqa: ASYNC109  (a per-request deadline, not a call bound)
        tls: EtcdTls | None = None,
    ) -> EtcdStore:
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
        if code in _CONNECTION_CODES:
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
            self._failover_task = asyncio.get_running_loop().create_task(
                self._failover(failed), name="etcd-failover"
            )

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

    # --- reads ------------------------------------------------------------------------------------

    async def get(self, key: str) -> KeyValue | None:
        self._current()
        check_key(key)
        request = rpc.RangeRequest(key=self._key(key))
        response = await self._call("get", lambda c: c.kv.Range(request, timeout=self._timeout))
        return self._key_value(response.kvs[0]) if response.kvs else None

    async def list(
        self, prefix: str, *, limit: int | None = None, start_after: str | None = None
    ) -> builtins.list[KeyValue]:
        self._current()
        check_key(prefix, "prefix")
        bound = check_limit(limit)
        start = self._key(prefix)
        end = _range_end(start)
        if start_after is not None:
            if not isinstance(start_after, str):
                raise InvalidArgument(f"invalid start_after {start_after!r}: expected a string")
            try:
                after = self._key(start_after) + b"\x00"  # the smallest key above start_after
            except UnicodeEncodeError as exc:
                raise InvalidArgument(f"invalid start_after {start_after!r}: not valid UTF-8") from exc
            start = max(start, after)
            if start >= end:
                return []
        # One more than the bound tells "too many" apart from "exactly the bound" in the same request.
        request = rpc.RangeRequest(key=start, range_end=end, limit=bound + 1 if limit is None else bound)
        response = await self._call("list", lambda c: c.kv.Range(request, timeout=self._timeout))
        kvs = response.kvs
        if len(kvs) > bound:
            raise ListTooLarge(
                f"listing {prefix!r} matched more than {bound} keys; pass limit and page with start_after"
            )
        return [self._key_value(kv) for kv in kvs]

    # --- writes -----------------------------------------------------------------------------------

    async def put(self, key: str, value: Any, *, lease: int | None = None) -> int:
        self._current()
        check_key(key)
        raw = encode_value(value)
        request = rpc.PutRequest(key=self._key(key), value=raw, lease=self._lease_for_put(lease))
        response = await self._call("put", lambda c: c.kv.Put(request, timeout=self._timeout))
        return int(response.header.revision)

    async def delete(self, key: str) -> bool:
        self._current()
        check_key(key)
        request = rpc.DeleteRangeRequest(key=self._key(key))
        response = await self._call("delete", lambda c: c.kv.DeleteRange(request, timeout=self._timeout))
        return int(response.deleted) > 0

    async def delete_prefix(self, prefix: str) -> int:
        self._current()
        check_key(prefix, "prefix")
        start = self._key(prefix)
        request = rpc.DeleteRangeRequest(key=start, range_end=_range_end(start))
        response = await self._call(
            "delete_prefix", lambda c: c.kv.DeleteRange(request, timeout=self._timeout)
        )
        return int(response.deleted)

    async def compare_and_set(
        self, key: str, value: Any, *, expected_version: int | None, lease: int | None = None
    ) -> bool:
        self._current()
        check_key(key)
        if expected_version is not None:
            check_version(expected_version)
        raw = encode_value(value)
        put = rpc.PutRequest(key=self._key(key), value=raw, lease=self._lease_for_put(lease))
        return await self._txn(
            "compare_and_set", [self._compare(key, expected_version)], [rpc.RequestOp(request_put=put)]
        )

    async def compare_and_delete(self, key: str, *, expected_version: int) -> bool:
        self._current()
        check_key(key)
        check_version(expected_version)
        delete = rpc.DeleteRangeRequest(key=self._key(key))
        return await self._txn(
            "compare_and_delete",
            [self._compare(key, expected_version)],
            [rpc.RequestOp(request_delete_range=delete)],
        )

    async def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> bool:
        self._current()
        plan = check_txn(compares, ops)
        requests = []
        for key, raw, lease in plan.ops:
            if raw is None:
                requests.append(
                    rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=self._key(key)))
                )
            else:
                put = rpc.PutRequest(key=self._key(key), value=raw, lease=self._lease_for_put(lease))
                requests.append(rpc.RequestOp(request_put=put))
        return await self._txn("txn", [self._compare(c.key, c.version) for c in plan.compares], requests)

    def _compare(self, key: str, version: int | None) -> Any:
        if version is None:  # absent: etcd's per-key version (number of writes since creation) is 0
            return rpc.Compare(
                key=self._key(key), target=rpc.Compare.VERSION, result=rpc.Compare.EQUAL, version=0
            )
        return rpc.Compare(
            key=self._key(key), target=rpc.Compare.MOD, result=rpc.Compare.EQUAL, mod_revision=version
        )

    async def _txn(self, what: str, compares: builtins.list[Any], ops: builtins.list[Any]) -> bool:
        request = rpc.TxnRequest(compare=compares, success=ops, failure=[])
        response = await self._call(what, lambda c: c.kv.Txn(request, timeout=self._timeout))
        return bool(response.succeeded)

    @staticmethod
    def _lease_for_put(lease: int | None) -> int:
        """etcd's lease field (0 = none); ids etcd cannot have granted are refused without a request."""
        if lease is None:
            return 0
        if not _lease_exists(_check_lease_id(lease)):
            raise LeaseNotFound(f"lease {lease} not found (expired or revoked)")
        return lease

    # --- watches ----------------------------------------------------------------------------------

    def watch(self, prefix: str, *, max_queue: int = DEFAULT_WATCH_QUEUE) -> Watch:
        self._current()
        check_key(prefix, "prefix")
        watch = Watch(prefix, max_queue, on_close=self._watch_closed)
        start_revision = self._seen_revision + 1  # every change this client could not have seen yet
        task = asyncio.get_running_loop().create_task(
            self._follow(watch, start_revision), name=f"etcd-watch {prefix}"
        )
        self._watches[watch] = task
        return watch

    def _watch_closed(self, watch: Watch) -> None:
        task = self._watches.pop(watch, None)
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    async def _follow(self, watch: Watch, start_revision: int) -> None:
        """Feed one etcd watch stream into `watch` until either ends."""
        conn: Connection | None = None
        call: Any = None
        key = self._key(watch.prefix)
        try:
            conn = self._current()
            call = conn.watch.Watch()
            create = rpc.WatchCreateRequest(key=key, range_end=_range_end(key), start_revision=start_revision)
            async with asyncio.timeout(self._timeout):
                await call.write(rpc.WatchRequest(create_request=create))
                response = await call.read()
                if response is grpc.aio.EOF or not response.created:
                    raise MetadataError(f"etcd did not create the watch on {watch.prefix!r}")
            while not watch.closed:
                if response is grpc.aio.EOF:
                    raise MetadataError(f"etcd closed the watch stream on {watch.prefix!r}")
                self._observe(response.header)
                if response.compact_revision:
                    raise WatchLagged(
                        f"etcd compacted revision {start_revision}..{response.compact_revision} before the "
                        f"watch on {watch.prefix!r} could read it; re-list and watch again"
                    )
                if response.canceled:
                    reason = response.cancel_reason or "no reason given"
                    raise MetadataError(f"etcd cancelled the watch on {watch.prefix!r}: {reason}")
                for event in response.events:
                    watch.feed(self._event(event))
                response = await call.read()
        except MetadataError as exc:
            watch.fail(exc)
        except grpc.aio.AioRpcError as exc:
            where = conn.endpoint if conn is not None else "etcd"
            watch.fail(
                MetadataError(f"etcd watch on {watch.prefix!r} at {where} failed: {describe_error(exc)}")
            )
            if conn is not None and exc.code() in _CONNECTION_CODES:
                self._maybe_failover(conn)
        except TimeoutError:
            watch.fail(
                MetadataError(f"etcd did not confirm the watch on {watch.prefix!r} in {self._timeout} s")
            )
        except (grpc.aio.UsageError, aetcd.ClientError, OSError) as exc:
            watch.fail(MetadataError(f"etcd watch on {watch.prefix!r} failed: {describe_error(exc)}"))
        finally:
            if call is not None:
                call.cancel()
            self._watches.pop(watch, None)

    def _event(self, event: Any) -> WatchEvent:
        key = self._user_key(event.kv.key)
        revision = int(event.kv.mod_revision)
        if event.type == rpc.Event.PUT:
            return WatchEvent("put", key, decode_value(event.kv.value, key), revision)
        return WatchEvent("delete", key, None, revision)

    # --- leases -----------------------------------------------------------------------------------

    async def grant_lease(self, ttl_seconds: float) -> int:
        """A lease of ceil(ttl_seconds) seconds, raised to etcd's minimum TTL (2 s by default)."""
        self._current()
        if (
            isinstance(ttl_seconds, bool)
            or not isinstance(ttl_seconds, int | float)
            or not 0 < ttl_seconds <= MAX_LEASE_TTL_SECONDS
        ):
            raise InvalidArgument(
                f"invalid lease TTL {ttl_seconds!r}: expected 0 < ttl <= {MAX_LEASE_TTL_SECONDS} seconds"
            )
        request = rpc.LeaseGrantRequest(TTL=math.ceil(ttl_seconds), ID=0)
        response = await self._call(
            "grant_lease", lambda c: c.lease.LeaseGrant(request, timeout=self._timeout)
        )
        if response.error:
            raise MetadataError(f"etcd refused to grant a lease: {response.error}")
        return int(response.ID)

    async def keep_alive(self, lease_id: int) -> None:
        self._current()
        if not _lease_exists(_check_lease_id(lease_id)):
            raise LeaseNotFound(f"lease {lease_id} not found (expired or revoked)")
        response = await self._call("keep_alive", lambda c: self._keep_alive_once(c, lease_id))
        if response is None or int(response.TTL) <= 0:
            raise LeaseNotFound(f"lease {lease_id} not found (expired or revoked)")

    async def _keep_alive_once(self, conn: Connection, lease_id: int) -> Any:
        """One LeaseKeepAlive round trip on a short-lived stream (the response, or None)."""
        call = conn.lease.LeaseKeepAlive(
            iter([rpc.LeaseKeepAliveRequest(ID=lease_id)]), timeout=self._timeout
        )
        try:
            response = await call.read()
        finally:
            call.cancel()
        return None if response is grpc.aio.EOF else response

    async def revoke_lease(self, lease_id: int) -> None:
        self._current()
        if not _lease_exists(_check_lease_id(lease_id)):
            return
        request = rpc.LeaseRevokeRequest(ID=lease_id)
        try:
            await self._call("revoke_lease", lambda c: c.lease.LeaseRevoke(request, timeout=self._timeout))
        except LeaseNotFound:
            return

    # --- lifecycle --------------------------------------------------------------------------------

    @property
    def revision(self) -> int:
        """The highest etcd revision this client has seen in a response."""
        return self._seen_revision

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        tasks = list(self._watches.values())
        watches = list(self._watches)
        self._watches.clear()
        failover, self._failover_task = self._failover_task, None
        if failover is not None:
            tasks.append(failover)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for watch in watches:
            watch.finish()
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._timeout):
                    await conn.close()
