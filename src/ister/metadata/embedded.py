"""`EmbeddedStore`: the standalone metadata backend.

State lives in an in-memory mirror (a dict plus a sorted key list) that serves every read. Each mutation is
first committed to `<dir>/metadata.sqlite3` (WAL journal, synchronous=FULL: a write that returned survives a
kill -9), then applied to the mirror and fed synchronously to the matching watchers. One global revision
counter, persisted with the data, numbers the mutations and keeps increasing across restarts.

Commits run on one thread of their own, never on the event loop (an fsync under load takes milliseconds
to far more), and mutations queued meanwhile share one SQLite transaction (group commit). A mutation is
checked and given its revision when it is called, in call order: its compares are evaluated once no
queued mutation touches the keys involved (so against committed state), and nothing awaits between that
check and its place in the queue. Reads see committed state only.

Leases live only in memory: a task deletes the keys of expired leases, and on open every key that was
attached to a lease by an earlier process is deleted (leases never survive a restart). A lock file
(`flock`) keeps a second process (or a second store in this one) off the same directory.

Its parts: here opening, reads, writes, watches, leases and closing; `embedded_commit.py` the mirror and the
group commit; `embedded_files.py` the SQLite file and the lock file.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import os
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ister.errors import InvalidArgument, MetadataError
from ister.limits import METADATA_TIMEOUT_SECONDS
from ister.metadata.embedded_commit import EmbeddedBase, Lease
from ister.metadata.embedded_files import DB_FILE, SqliteCopy, lock_directory
from ister.metadata.store import (
    DEFAULT_WATCH_QUEUE,
    Compare,
    KeyValue,
    LeaseNotFound,
    ListTooLarge,
    Op,
    Watch,
    check_key,
    check_limit,
    decode_value,
    encode_value,
)
from ister.metadata.txn import check_txn, check_version

log = logging.getLogger(__name__)

LEASE_RETRY_SECONDS = 0.5
MAX_LEASE_TTL_SECONDS = 365 * 24 * 3600.0


class EmbeddedStore(EmbeddedBase):
    """The standalone `MetadataStore` (see the module docstring)."""

    @classmethod
    def in_memory(cls) -> EmbeddedStore:
        """A store without persistence (unit tests)."""
        return cls()

    @classmethod
    async def open(cls, directory: Path) -> EmbeddedStore:
        directory = Path(directory)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            lock_fd = lock_directory(directory)
        except OSError as exc:
            raise MetadataError(f"cannot open metadata directory {directory}: {exc}") from exc
        db: SqliteCopy | None = None
        try:
            db = SqliteCopy(directory / DB_FILE)
            revision, rows = db.load()
            store = cls(db, lock_fd)
            store._load(revision, rows)
        except BaseException:
            if db is not None:
                db.close()
            os.close(lock_fd)
            raise
        return store

    # --- reads ------------------------------------------------------------------------------------

    async def get(self, key: str) -> KeyValue | None:
        self._check_open()
        check_key(key)
        entry = self._entries.get(key)
        return None if entry is None else KeyValue(key, decode_value(entry.raw, key), entry.revision)

    async def list(
        self, prefix: str, *, limit: int | None = None, start_after: str | None = None
    ) -> list[KeyValue]:
        self._check_open()
        check_key(prefix, "prefix")
        bound = check_limit(limit)
        if start_after is not None and not isinstance(start_after, str):
            raise InvalidArgument(f"invalid start_after {start_after!r}: expected a string")
        keys = self._range(prefix, start_after, bound + 1)
        if len(keys) > bound:
            if limit is None:
                raise ListTooLarge(
                    f"listing {prefix!r} matched more than {bound} keys; pass limit and page with start_after"
                )
            keys = keys[:bound]
        return [KeyValue(k, decode_value(self._entries[k].raw, k), self._entries[k].revision) for k in keys]

    def _range(self, prefix: str, start_after: str | None, count: int | None) -> builtins.list[str]:
        if start_after is not None and start_after >= prefix:
            keys = self._keys.iter_from(start_after, inclusive=False)
        else:
            keys = self._keys.iter_from(prefix)
        found: builtins.list[str] = []
        for key in keys:
            if not key.startswith(prefix) or (count is not None and len(found) >= count):
                break
            found.append(key)
        return found

    # --- writes -----------------------------------------------------------------------------------

    async def put(self, key: str, value: Any, *, lease: int | None = None) -> int:
        self._check_open()
        check_key(key)
        raw = encode_value(value)
        if lease is not None:
            self._live_lease(lease)
        return await self._mutate([(key, raw, lease)], [])

    async def delete(self, key: str) -> bool:
        self._check_open()
        check_key(key)
        await self._settle([key])
        if not self._exists(key):
            return False
        await self._mutate([], [key])
        return True

    async def delete_prefix(self, prefix: str) -> int:
        self._check_open()
        check_key(prefix, "prefix")
        while pending := [k for k in self._pending_keys if k.startswith(prefix)]:
            await self._settle(pending)
        keys = self._range(prefix, None, None)
        if keys:
            await self._mutate([], keys)
        return len(keys)

    async def compare_and_set(
        self, key: str, value: Any, *, expected_version: int | None, lease: int | None = None
    ) -> bool:
        self._check_open()
        check_key(key)
        if expected_version is not None:
            check_version(expected_version)
        raw = encode_value(value)
        await self._settle([key])
        if lease is not None:
            self._live_lease(lease)
        entry = self._entries.get(key)
        current = None if entry is None else entry.revision
        if current != expected_version:
            return False
        await self._mutate([(key, raw, lease)], [])
        return True

    async def compare_and_delete(self, key: str, *, expected_version: int) -> bool:
        self._check_open()
        check_key(key)
        check_version(expected_version)
        await self._settle([key])
        entry = self._entries.get(key)
        if entry is None or entry.revision != expected_version:
            return False
        await self._mutate([], [key])
        return True

    async def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> bool:
        self._check_open()
        plan = check_txn(compares, ops)
        await self._settle([c.key for c in plan.compares] + [key for key, _, _ in plan.ops])
        for _key, raw, lease in plan.ops:
            if raw is not None and lease is not None:
                self._live_lease(lease)
        for compare in plan.compares:
            entry = self._entries.get(compare.key)
            if (None if entry is None else entry.revision) != compare.version:
                return False
        puts = [(key, raw, lease) for key, raw, lease in plan.ops if raw is not None]
        deletes = [key for key, raw, _lease in plan.ops if raw is None and self._exists(key)]
        if puts or deletes:
            await self._mutate(puts, deletes)
        return True

    # --- watches ----------------------------------------------------------------------------------

    def watch(self, prefix: str, *, max_queue: int = DEFAULT_WATCH_QUEUE) -> Watch:
        self._check_open()
        check_key(prefix, "prefix")
        watch = Watch(prefix, max_queue, on_close=self._watches.discard)
        self._watches.add(watch)
        return watch

    # --- leases -----------------------------------------------------------------------------------

    async def grant_lease(self, ttl_seconds: float) -> int:
        self._check_open()
        if (
            isinstance(ttl_seconds, bool)
            or not isinstance(ttl_seconds, int | float)
            or not 0 < ttl_seconds <= MAX_LEASE_TTL_SECONDS
        ):
            raise InvalidArgument(
                f"invalid lease TTL {ttl_seconds!r}: expected 0 < ttl <= {MAX_LEASE_TTL_SECONDS} seconds"
            )
        lease_id = secrets.randbits(63)
        while lease_id == 0 or lease_id in self._leases:
            lease_id = secrets.randbits(63)
        ttl = float(ttl_seconds)
        self._leases[lease_id] = Lease(lease_id, ttl, self._now() + ttl)
        self._ensure_lease_task()
        self._lease_wakeup.set()
        return lease_id

    async def keep_alive(self, lease_id: int) -> None:
        self._check_open()
        lease = self._live_lease(lease_id)
        lease.deadline = self._now() + lease.ttl

    async def revoke_lease(self, lease_id: int) -> None:
        self._check_open()
        lease = self._leases.get(lease_id)
        if lease is None:
            return
        lease.deadline = float("-inf")  # dead from now on, even if deleting its keys fails below
        await self._expire(lease)  # on failure the expiry task retries the delete

    def _live_lease(self, lease_id: int) -> Lease:
        if isinstance(lease_id, bool) or not isinstance(lease_id, int):
            raise InvalidArgument(f"invalid lease id {lease_id!r}")
        lease = self._leases.get(lease_id)
        if lease is not None and lease.deadline <= self._now():
            self._expire_soon(lease)
            lease = None
        if lease is None:
            raise LeaseNotFound(f"lease {lease_id} not found (expired or revoked)")
        return lease

    def _expire_soon(self, lease: Lease) -> asyncio.Future[None] | None:
        """Forget a dead lease and queue the deletion of its keys (without waiting for it). Should that
        fail, the lease is back with its keys and the expiry task retries."""
        self._leases.pop(lease.id, None)
        keys = sorted(k for k in lease.keys if self._exists(k))
        if not keys:
            return None
        _, future = self._plan([], keys)
        if future is None:
            return None

        def undo(done: asyncio.Future[None]) -> None:
            if (done.cancelled() or done.exception() is not None) and not self._closed:
                self._leases.setdefault(lease.id, lease)
                lease.keys = {k for k, e in self._entries.items() if e.lease == lease.id}
                self._lease_wakeup.set()

        future.add_done_callback(undo)
        return future

    async def _expire(self, lease: Lease) -> None:
        future = self._expire_soon(lease)
        if future is not None:
            await asyncio.shield(future)

    def _ensure_lease_task(self) -> None:
        if self._lease_task is None or self._lease_task.done():
            self._lease_task = self._tasks.spawn(self._lease_loop(), "metadata-lease-expiry")

    async def _lease_loop(self) -> None:
        while True:
            now = self._now()
            retry = False
            for lease in [lease for lease in self._leases.values() if lease.deadline <= now]:
                try:
                    await self._expire(lease)
                except MetadataError:
                    log.exception("expiring metadata lease %d failed; retrying", lease.id)
                    retry = True
            next_deadline = min((lease.deadline for lease in self._leases.values()), default=None)
            timeout = None if next_deadline is None else max(0.0, next_deadline - self._now())
            if retry:
                timeout = LEASE_RETRY_SECONDS
            self._lease_wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._lease_wakeup.wait(), timeout)

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    # --- lifecycle --------------------------------------------------------------------------------

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True  # new mutations are refused; the queued ones are committed first
        await self._stop_committer()
        task, self._lease_task = self._lease_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(task, METADATA_TIMEOUT_SECONDS)
        await self._tasks.close()  # none left running; none starts from now on
        for watch in list(self._watches):
            watch.finish()
        self._watches.clear()
        self._leases.clear()
        if self._db is not None and self._committer is None:  # else closed on the commit thread
            self._db.close()
        self._db = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
