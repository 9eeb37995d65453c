"""What a WAL's writer reports back, run on the loop: commits (the cache, the kept frames, readers and
appenders woken), appends refused for lack of disk or descriptors, failure, and the writer's stop."""

from __future__ import annotations

from ister.errors import StorageError, StorageExhausted

from .entry import Entry
from .walstate import WalState


class WalCompletions(WalState):
    __slots__ = ()

    def _on_commit(self, group: list[Entry], committed: int, synced: int, nbytes: int) -> None:
        # One cache chunk per group: O(1) Python work per append, not per record. The payload lists are
        # private copies made by append(), so the first one can be extended in place.
        visible_before = self.committed_offset
        chunk: list[bytes] | None = None
        chunk_first = 0
        chunk_bytes = 0
        tail = self._frame_tail
        for entry in group:
            if entry.count:
                if tail is not None:
                    tail.add(entry.first_offset, entry.count, entry.data)
                payloads = entry.payloads
                if payloads is None:  # frames appended as they came (a follower's): not cached
                    if chunk is not None:
                        self._cache.add(chunk_first, chunk, chunk_bytes)
                        chunk, chunk_bytes = None, 0
                    self._cache.reset(entry.first_offset + entry.count)
                else:
                    if chunk is None:
                        chunk, chunk_first = payloads, entry.first_offset
                    else:
                        chunk.extend(payloads)
                    chunk_bytes += entry.payload_bytes
        if chunk is not None:
            self._cache.add(chunk_first, chunk, chunk_bytes)
        if nbytes:
            self._last_append = self._loop.time()
        self._committed = committed
        self._synced = synced
        self._space.taken(nbytes)
        # Readers are woken before the appenders: wake-ups run in the order they are scheduled, so a live
        # consumer's delivery goes out without waiting behind the producer's acknowledgement.
        if self._read_waiters:
            self._wake_readers()
        if self.on_committed is not None and self.committed_offset > visible_before:
            self.on_committed()  # under a cap (replicated) readers see records once cap_visible lets them
        for entry in group:
            future = entry.future
            if future is not None and not future.done():
                future.set_result(entry.first_offset)
        self._space.wake()

    def _on_refused(self, entries: list[Entry], err: StorageExhausted, resume: int) -> None:
        # Every entry at or after `resume` is in `entries` (the writer refuses new ones until accept()).
        nbytes = 0
        for entry in entries:
            nbytes += len(entry.data)
            future = entry.future
            if future is not None and not future.done():
                future.set_exception(type(err)(str(err)))
        self._space.taken(nbytes)
        self._next_offset = resume
        self._writer.accept()
        self._space.wake()

    def _on_failure(self, entries: list[Entry], err: StorageError) -> None:
        self._failed = err
        for entry in entries:
            future = entry.future
            if future is not None and not future.done():
                future.set_exception(StorageError(str(err)))
        self._space.fail(err)
        self._wake_readers()

    def _on_writer_stopped(self) -> None:
        self._writer.detach()  # no cycle between the two once closed (frozen objects, broker/heap.py)
        if self._stopped is not None and not self._stopped.done():
            self._stopped.set_result(None)
