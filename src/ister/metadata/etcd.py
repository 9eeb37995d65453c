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

Its parts: here reads, writes, transactions, leases and closing; `etcd_watch.py` the watches; both over
`etcd_base.py` (the connection, calls and their errors, keys); `etcd_channel.py` the gRPC channel.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import math
from collections.abc import Sequence
from typing import Any

import grpc
import grpc.aio
from aetcd import rpc

from ister.errors import InvalidArgument, MetadataError
from ister.metadata.etcd_base import range_end
from ister.metadata.etcd_channel import Connection
from ister.metadata.etcd_channel import EtcdTls as EtcdTls  # re-exported: callers name it from here
from ister.metadata.etcd_channel import parse_endpoint as parse_endpoint
from ister.metadata.etcd_watch import EtcdWatches
from ister.metadata.store import (
    Compare,
    KeyValue,
    LeaseNotFound,
    ListTooLarge,
    Op,
    check_key,
    check_limit,
    encode_value,
)
from ister.metadata.txn import check_txn, check_version

log = logging.getLogger(__name__)

MAX_LEASE_TTL_SECONDS = 365 * 24 * 3600.0
MAX_LEASE_ID = 2**63 - 1  # etcd lease ids are positive int64


def _check_lease_id(lease_id: object) -> int:
    if isinstance(lease_id, bool) or not isinstance(lease_id, int):
        raise InvalidArgument(f"invalid lease id {lease_id!r}")
    return lease_id


def _lease_exists(lease_id: int) -> bool:
    """False for ids etcd can never have granted (so no request is needed to know it is not found)."""
    return 0 < lease_id <= MAX_LEASE_ID


class EtcdStore(EtcdWatches):
    """The etcd `MetadataStore` (see the module docstring). Create it with `await EtcdStore.connect(...)`."""

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
        end = range_end(start)
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
        request = rpc.DeleteRangeRequest(key=start, range_end=range_end(start))
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
        await self._tasks.close()  # none left running; none starts from now on
        for watch in watches:
            watch.finish()
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._timeout):
                    await conn.close()
