"""A WAL's back-pressure: appends wait (in order) while the writer is more than `max_queued_bytes` of
encoded frames behind. `QueuedBytes` is the one owner of that count and of the waiting appends; the `Wal`
adds what it hands the writer and takes off what the writer committed, refused or dropped. Loop only."""

from __future__ import annotations

import asyncio
from collections import deque

from ister.errors import StorageError


class QueuedBytes:
    # slots: one per reliable topic's WAL (100,000 of them)
    __slots__ = ("_limit", "_loop", "_waiters", "queued")

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int) -> None:
        self._loop = loop
        self._limit = limit
        self.queued = 0  # bytes handed to the writer (or granted to a waiter) and not yet taken off
        # appends waiting for room, FIFO (created when first needed: most WALs never wait)
        self._waiters: deque[tuple[int, asyncio.Future[None]]] | None = None

    async def reserve(self, size: int) -> bool:
        """Wait for room while the writer is more than the limit behind; True when it did (the bytes are
        then counted: `release` them if they are not handed over). Returns at once, without suspending,
        when there is room (the caller counts them with `add` once handed over)."""
        if self._waiters or (self.queued and self.queued + size > self._limit):
            await self._wait(size)
            return True
        return False

    def add(self, size: int) -> None:
        self.queued += size

    def release(self, size: int) -> None:
        """`size` bytes granted or reserved are not handed over after all."""
        self.queued -= size
        self.wake()

    def taken(self, size: int) -> None:
        """`size` bytes left the queue (committed or refused); `wake` lets waiters in once the caller has
        done the rest of its completions."""
        self.queued -= size

    def wake(self) -> None:
        """Let in the waiting appends there is room for now, in order."""
        if self._waiters:
            self._grant()

    def fail(self, err: StorageError) -> None:
        """The waiting appends get `err` (the WAL failed or closes)."""
        while self._waiters:
            _, waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(StorageError(str(err)))

    async def _wait(self, size: int) -> None:
        waiter: asyncio.Future[None] = self._loop.create_future()
        if self._waiters is None:
            self._waiters = deque()
        self._waiters.append((size, waiter))
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self.release(size)  # room was granted to us but we will not use it
            raise

    def _grant(self) -> None:
        waiters = self._waiters
        if waiters is None:
            return
        while waiters:
            size, waiter = waiters[0]
            if waiter.done():
                waiters.popleft()
                continue
            if self.queued and self.queued + size > self._limit:
                return
            waiters.popleft()
            self.queued += size
            waiter.set_result(None)
