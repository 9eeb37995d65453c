"""The embedded store's state and group commit (embedded.py): the in-memory mirror, the queue of checked
mutations and the thread that commits them to SQLite in groups, applying each to the mirror and its
watchers once durable."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ister.errors import MetadataError
from ister.limits import METADATA_TIMEOUT_SECONDS
from ister.metadata.embedded_files import PutOp, Row, SqliteCopy
from ister.metadata.sortedkeys import SortedKeys
from ister.metadata.store import (
    Watch,
    WatchEvent,
    decode_value,
)
from ister.tasks import TaskSupervisor

log = logging.getLogger(__name__)

MAX_GROUP = 1_000  # mutations per SQLite transaction


@dataclass(slots=True)
class _Entry:
    raw: bytes
    revision: int
    lease: int | None


@dataclass(slots=True)
class Lease:
    id: int
    ttl: float
    deadline: float
    keys: set[str] = field(default_factory=set)


@dataclass(slots=True)
class _Pending:
    """A mutation checked and numbered, waiting for its commit."""

    revision: int
    puts: list[PutOp]
    deletes: list[str]
    future: asyncio.Future[None]


class EmbeddedBase:
    """What every part of `EmbeddedStore` uses: the mirror, the commit queue, the watchers."""

    def __init__(self, db: SqliteCopy | None = None, lock_fd: int | None = None) -> None:
        self._db = db
        self._lock_fd = lock_fd
        self._revision = 0
        self._entries: dict[str, _Entry] = {}
        self._keys = SortedKeys()  # the keys of _entries, in order
        self._watches: set[Watch] = set()
        self._leases: dict[int, Lease] = {}
        self._lease_wakeup = asyncio.Event()
        self._lease_task: asyncio.Task[None] | None = None
        self._tasks = TaskSupervisor("embedded metadata store")  # lease expiry and the group committer
        self._closed = False
        # Group commit (persistent stores only): mutations checked and numbered, not yet committed.
        self._planned = 0  # the revision given to the latest mutation (== _revision when none is queued)
        self._queue: builtins.list[_Pending] = []
        self._pending_keys: dict[str, asyncio.Future[None]] = {}  # key -> last queued mutation touching it
        self._pending_view: dict[str, int | None] = {}  # key -> its lease after the queue; absent: deleted
        self._pending_gone: set[str] = set()  # keys the queue deletes
        self._committer: asyncio.Task[None] | None = None
        self._commit_wakeup: asyncio.Event | None = None
        self._executor: ThreadPoolExecutor | None = None

    def _load(self, revision: int, rows: Iterable[Row]) -> None:
        for key, raw, rev, _lease in rows:
            raw = bytes(raw)
            decode_value(raw, key)  # refuse to start on a corrupt value rather than fail later
            self._entries[key] = _Entry(raw, int(rev), None)
        self._keys = SortedKeys(self._entries)
        self._revision = revision
        self._planned = revision

    # --- group commit -----------------------------------------------------------------------------

    async def _settle(self, keys: Iterable[str]) -> None:
        """Wait until no queued mutation touches `keys` (then the mirror holds their latest state)."""
        keys = builtins.list(keys)
        while waits := {f for k in keys if (f := self._pending_keys.get(k)) is not None}:
            await asyncio.wait(waits)
            self._check_open()

    def _exists(self, key: str) -> bool:
        """Whether `key` exists once everything queued is applied."""
        if key in self._pending_gone:
            return False
        return key in self._pending_view or key in self._entries

    def _lease_of(self, key: str) -> int | None:
        if key in self._pending_gone:
            return None
        if key in self._pending_view:
            return self._pending_view[key]
        entry = self._entries.get(key)
        return None if entry is None else entry.lease

    async def _mutate(self, puts: builtins.list[PutOp], deletes: builtins.list[str]) -> int:
        revision, future = self._plan(puts, deletes)
        if future is not None:
            await asyncio.shield(future)  # a cancelled caller's mutation is committed all the same
        return revision

    def _plan(
        self, puts: builtins.list[PutOp], deletes: builtins.list[str]
    ) -> tuple[int, asyncio.Future[None] | None]:
        """Number a checked mutation and move lease bookkeeping to its outcome; apply it now (in-memory
        store) or queue it for the committer (returns its future)."""
        revision = self._planned + 1
        self._planned = revision
        for key, _raw, lease in puts:
            self._detach(key, self._lease_of(key))
            if lease is not None:
                self._leases[lease].keys.add(key)
        for key in deletes:
            self._detach(key, self._lease_of(key))
        if self._db is None:
            self._apply(revision, puts, deletes)
            return revision, None
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._queue.append(_Pending(revision, puts, deletes, future))
        for key, _raw, lease in puts:
            self._pending_keys[key] = future
            self._pending_view[key] = lease
            self._pending_gone.discard(key)
        for key in deletes:
            self._pending_keys[key] = future
            self._pending_view.pop(key, None)
            self._pending_gone.add(key)
        if self._committer is None:
            self._commit_wakeup = asyncio.Event()
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="metadata-commit")
            self._committer = self._tasks.spawn(self._commit_loop(), "metadata-commit")
        assert self._commit_wakeup is not None
        self._commit_wakeup.set()
        return revision, future

    async def _commit_loop(self) -> None:
        assert self._commit_wakeup is not None and self._db is not None
        loop = asyncio.get_running_loop()
        while True:
            await self._commit_wakeup.wait()
            self._commit_wakeup.clear()
            while self._queue:
                group = self._queue[:MAX_GROUP]
                del self._queue[:MAX_GROUP]
                rows = [(p.revision, p.puts, p.deletes) for p in group]
                try:
                    await loop.run_in_executor(self._executor, self._db.commit, rows)
                except BaseException as exc:
                    self._fail_queued(group, exc)
                    if isinstance(exc, asyncio.CancelledError):
                        raise
                    continue
                for pending in group:
                    self._apply(pending.revision, pending.puts, pending.deletes)
                    self._settled(pending)
                    if not pending.future.done():
                        pending.future.set_result(None)

    def _settled(self, pending: _Pending) -> None:
        for key in [k for k, _, _ in pending.puts] + pending.deletes:
            if self._pending_keys.get(key) is pending.future:
                del self._pending_keys[key]
                self._pending_view.pop(key, None)
                self._pending_gone.discard(key)

    def _fail_queued(self, group: builtins.list[_Pending], exc: BaseException) -> None:
        """The group's commit failed: it and everything queued after it (checked on top of it) fail."""
        failed = group + self._queue
        self._queue = []
        self._pending_keys.clear()
        self._pending_view.clear()
        self._pending_gone.clear()
        self._planned = self._revision
        for lease in self._leases.values():  # undo the failed mutations' lease bookkeeping
            lease.keys = {k for k, e in self._entries.items() if e.lease == lease.id}
        err = exc if isinstance(exc, MetadataError) else MetadataError(f"metadata commit failed: {exc!r}")
        if not isinstance(exc, asyncio.CancelledError):
            log.error("%s (%d mutations refused)", err, len(failed))
        for pending in failed:
            if not pending.future.done():
                pending.future.set_exception(MetadataError(str(err)))

    def _apply(self, revision: int, puts: builtins.list[PutOp], deletes: builtins.list[str]) -> None:
        """A committed mutation: into the mirror, then to the watchers."""
        self._revision = revision
        for key, raw, lease in puts:
            if key not in self._entries:
                self._keys.add(key)
            self._entries[key] = _Entry(raw, revision, lease)
            self._notify("put", key, raw, revision)
        for key in deletes:
            if self._entries.pop(key, None) is None:
                continue
            self._keys.discard(key)
            self._notify("delete", key, None, revision)

    def _detach(self, key: str, lease_id: int | None) -> None:
        if lease_id is not None and (lease := self._leases.get(lease_id)) is not None:
            lease.keys.discard(key)

    def _notify(self, kind: str, key: str, raw: bytes | None, revision: int) -> None:
        for watch in list(self._watches):
            if key.startswith(watch.prefix):
                # Each watcher decodes its own copy, so no two holders share a mutable value.
                value = None if raw is None else decode_value(raw, key)
                watch.feed(WatchEvent("put" if kind == "put" else "delete", key, value, revision))

    def _check_open(self) -> None:
        if self._closed:
            raise MetadataError("metadata store is closed")

    @property
    def revision(self) -> int:
        """The revision of the latest mutation."""
        return self._revision

    async def _stop_committer(self) -> None:
        committer, executor, db = self._committer, self._executor, self._db
        if committer is None or executor is None or db is None:
            return
        waiting = {p.future for p in self._queue} | set(self._pending_keys.values())
        if waiting:
            _, late = await asyncio.wait(waiting, timeout=METADATA_TIMEOUT_SECONDS)
            if late:
                log.error("metadata store closed with %d mutations not committed", len(late))
        committer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await committer
        try:  # after any commit still running there (a cancelled wait does not stop it)
            await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(executor, db.close), 10.0)
        except TimeoutError:
            log.error("metadata store: the commit thread did not finish; database left open")
        executor.shutdown(wait=False)
