"""Key-Shared ordering: per key, its unresolved offsets in order; only a key's head may be sent.

Each key's offsets form a chain: `_next[offset]` is the key's next held offset and `_tail[key]` its last one
(no per-key container, so a window of distinct keys costs a few dict items per message). Only a key's head
is ever sent, so only heads are ever resolved, and resolving one makes its successor the new head.

`heads` is a min-heap of offsets that may be sendable heads (checked when popped: still held, never sent;
duplicates pop consecutively). `parked` holds heads (and waiting retries) that no attached consumer's filters
accept; they are requeued when the consumer set changes.

`unmatched` names the keys of parked heads, and `n_unmatched` counts every held message of those keys (the
parked head and the messages queued behind it, also those offered since). The state machine lets them wait
outside the dispatch window (up to a bound), so a key nobody accepts does not stall the keys somebody does.
Both are only meaningful while `parked_version` is the selector's version; `clear_parked` resets them.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence


class KeyQueues:
    __slots__ = ("_next", "_tail", "heads", "key_of", "n_unmatched", "parked", "parked_version", "unmatched")

    def __init__(self) -> None:
        self.key_of: dict[int, str] = {}  # every held offset -> its key
        self._next: dict[int, int] = {}
        self._tail: dict[str, int] = {}
        self.heads: list[int] = []
        self.parked: set[int] = set()
        self.parked_version = -1
        self.unmatched: set[str] = set()  # keys of the parked heads
        self.n_unmatched = 0  # held messages of those keys

    def __contains__(self, offset: int) -> bool:
        return offset in self.key_of

    def add(self, offset: int, key: str) -> None:
        """Append one offered message (offsets arrive ascending)."""
        self.key_of[offset] = key
        if self.unmatched and key in self.unmatched:
            self.n_unmatched += 1
        tail = self._tail.get(key)
        if tail is None:
            heapq.heappush(self.heads, offset)
        else:
            self._next[tail] = offset
        self._tail[key] = offset

    def add_run(self, first: int, keys: Sequence[str]) -> None:
        """Append consecutive offered messages first, first + 1, ... (all above every held offset)."""
        run = range(first, first + len(keys))
        self.key_of.update(zip(run, keys, strict=True))
        tails, nxt, heads = self._tail, self._next, self.heads
        get = tails.get
        for offset, key in zip(run, keys, strict=True):
            tail = get(key)
            if tail is None:
                heads.append(offset)  # larger than every item: appending keeps the heap order
            else:
                nxt[tail] = offset
            tails[key] = offset
        unmatched = self.unmatched
        if unmatched:
            self.n_unmatched += sum(1 for key in keys if key in unmatched)

    def park(self, offset: int, version: int) -> None:
        """No attached consumer accepts the key of `offset`, its head: hold it (and count its key's messages
        as unmatched) until the consumer set changes from `version`."""
        self.parked.add(offset)
        self.parked_version = version
        key = self.key_of[offset]
        if key in self.unmatched:
            return
        self.unmatched.add(key)
        n, nxt = 1, self._next
        successor = nxt.get(offset)
        while successor is not None:
            n += 1
            successor = nxt.get(successor)
        self.n_unmatched += n

    def clear_parked(self) -> list[int]:
        """The consumer set changed: forget which keys nobody accepts; returns the parked offsets in order."""
        out = sorted(self.parked)
        self.parked.clear()
        self.unmatched.clear()
        self.n_unmatched = 0
        return out

    def release(self, offset: int) -> None:
        """`offset` (its key's head) is resolved: drop it and queue the key's successor for sending."""
        key = self.key_of.pop(offset)
        parked = self.parked
        if parked:
            parked.discard(offset)
        successor = self._next.pop(offset, None)
        if self.unmatched and key in self.unmatched:
            self.n_unmatched -= 1
            if successor is None:
                self.unmatched.discard(key)
        if successor is None:
            del self._tail[key]
        elif successor not in parked:
            heapq.heappush(self.heads, successor)

    def release_all(self, offsets: Iterable[int]) -> None:
        """`release` for many offsets."""
        key_of, nxt, tails, parked = self.key_of, self._next, self._tail, self.parked
        unmatched = self.unmatched
        fresh: list[int] = []
        for offset in offsets:
            key = key_of.pop(offset)
            if parked:
                parked.discard(offset)
            successor = nxt.pop(offset, None)
            if unmatched and key in unmatched:
                self.n_unmatched -= 1
                if successor is None:
                    unmatched.discard(key)
            if successor is None:
                del tails[key]
            elif successor not in parked:
                fresh.append(successor)
        if fresh:
            heads = self.heads
            if len(fresh) == 1:
                heapq.heappush(heads, fresh[0])
            else:
                heads.extend(fresh)
                heapq.heapify(heads)
