"""Key-Shared ordering: per key, its unresolved offsets in order, and which of them may be sent now.

The rule (Pulsar's, not Danube's one message per key): offset o of key k may be sent to consumer c only
when every unresolved offset of k below o is in flight at c, and nothing of k is in flight elsewhere. So a
key keeps several messages in flight, in order, to its one consumer (up to the subscription's window); a
message of k that must be sent again (nack, ack timeout, a consumer gone) goes before any later message of
k, in offset order; and a key that moves to another consumer (a consumer joined or left, a filter changed)
starts there only once everything its old consumer holds is resolved or handed back.

Per key:
- the chain of held offsets: `_next`/`_prev` link them, `_tail[key]` is the last (no per-key container, so a
  window of distinct keys costs a few dict items per message);
- `fresh[key]`: its first never-sent offset (every later one is never-sent too: sends follow the chain);
- `_out[key]`: [consumer, count] of its messages in flight (all at one consumer, by the rule);
- `waiting[key]`: its sent, unresolved offsets that are out of flight (waiting for a retry, exhausted or
  waiting for their dead-letter publish), ascending. Only the lowest may be sent; nothing never-sent may.

`heads` is a min-heap of fresh offsets that may be sendable (checked when popped: still the key's fresh
offset; duplicates pop consecutively). A key is pushed again whenever its gate may have opened: its last
in-flight message left, or its last waiting one was sent or resolved. Due retries that may not go yet wait
in `held_retries` and are named in `woken` when their key's gate changes (the state machine queues them
again). `parked` holds fresh offsets and retries that no attached consumer's filters accept; they are
requeued when the consumer set changes.

`unmatched` names the keys of parked offsets, and `n_unmatched` counts every held message of those keys.
The state machine lets them wait outside the dispatch window (up to a bound), so a key nobody accepts does
not stall the keys somebody does. Both are only meaningful while `parked_version` is the selector's
version; `clear_parked` resets them.
"""

from __future__ import annotations

import heapq
from bisect import insort
from collections.abc import Iterable, Sequence


class KeyQueues:
    __slots__ = (
        "_next",
        "_out",
        "_prev",
        "_tail",
        "fresh",
        "heads",
        "held_retries",
        "key_of",
        "moving",
        "n_unmatched",
        "parked",
        "parked_version",
        "seen_version",
        "unmatched",
        "waiting",
        "woken",
    )

    def __init__(self) -> None:
        self.key_of: dict[int, str] = {}  # every held offset -> its key
        self._next: dict[int, int] = {}
        self._prev: dict[int, int] = {}
        self._tail: dict[str, int] = {}
        self.fresh: dict[str, int] = {}
        self._out: dict[str, list[int]] = {}
        self.waiting: dict[str, list[int]] = {}
        self.heads: list[int] = []
        self.held_retries: dict[str, list[int]] = {}
        self.woken: list[str] = []
        self.moving: set[str] = set()  # keys whose fresh messages wait for another consumer's in-flight ones
        self.seen_version = 0  # the consumer set `consumers_changed` last saw
        self.parked: set[int] = set()
        self.parked_version = -1
        self.unmatched: set[str] = set()  # keys of the parked offsets
        self.n_unmatched = 0  # held messages of those keys

    def __contains__(self, offset: int) -> bool:
        return offset in self.key_of

    # -- feeding -----------------------------------------------------------------------------------------
    def add(self, offset: int, key: str) -> None:
        """Append one offered message (offsets arrive ascending)."""
        self.key_of[offset] = key
        if self.unmatched and key in self.unmatched:
            self.n_unmatched += 1
        tail = self._tail.get(key)
        if tail is not None:
            self._next[tail] = offset
            self._prev[offset] = tail
        self._tail[key] = offset
        if key not in self.fresh:
            self.fresh[key] = offset
            heapq.heappush(self.heads, offset)

    def add_run(self, first: int, keys: Sequence[str]) -> None:
        """Append consecutive offered messages first, first + 1, ... (all above every held offset)."""
        run = range(first, first + len(keys))
        self.key_of.update(zip(run, keys, strict=True))
        tails, nxt, prv, fresh, heads = self._tail, self._next, self._prev, self.fresh, self.heads
        get = tails.get
        for offset, key in zip(run, keys, strict=True):
            tail = get(key)
            if tail is not None:
                nxt[tail] = offset
                prv[offset] = tail
            tails[key] = offset
            if key not in fresh:
                fresh[key] = offset
                heads.append(offset)  # larger than every item: appending keeps the heap order
        unmatched = self.unmatched
        if unmatched:
            self.n_unmatched += sum(1 for key in keys if key in unmatched)

    # -- the sending rule ---------------------------------------------------------------------------------
    def take_fresh(self, key: str, consumer: int) -> list[int] | None:
        """Every never-sent offset of `key`, ascending, now in flight at `consumer`; None (nothing taken)
        while the key waits: a message of it to send again first, or messages in flight elsewhere."""
        if key in self.waiting:
            return None
        out = self._out.get(key)
        if out is not None and out[0] != consumer:
            self.moving.add(key)
            return None
        offset: int | None = self.fresh.pop(key)
        run: list[int] = []
        nxt = self._next
        while offset is not None:
            run.append(offset)
            offset = nxt.get(offset)
        if out is None:
            self._out[key] = [consumer, len(run)]
        else:
            out[1] += len(run)
        return run

    def may_resend(self, offset: int, consumer: int) -> bool:
        """May the waiting `offset` go to `consumer` now? Only its key's lowest waiting offset may, and only
        while nothing of the key is in flight at another consumer."""
        key = self.key_of[offset]
        waiting = self.waiting.get(key)
        if not waiting or waiting[0] != offset:
            return False
        out = self._out.get(key)
        return out is None or out[0] == consumer

    def hold_retry(self, offset: int) -> None:
        """A due retry that may not go yet: kept until its key's gate changes (then named in `woken`)."""
        key = self.key_of[offset]
        held = self.held_retries.get(key)
        if held is None:
            self.held_retries[key] = [offset]
        else:
            held.append(offset)

    def resent(self, offset: int, consumer: int) -> None:
        """The waiting `offset` (its key's lowest, `may_resend`) is in flight at `consumer` again."""
        key = self.key_of[offset]
        waiting = self.waiting[key]
        del waiting[0]
        out = self._out.get(key)
        if out is None:
            self._out[key] = [consumer, 1]
        else:
            out[1] += 1
        if not waiting:
            del self.waiting[key]
        self._gate_changed(key)

    def left_flight(self, offset: int) -> None:
        """`offset` was taken out of flight without being resolved (nack, timeout, hand-back)."""
        key = self.key_of[offset]
        waiting = self.waiting.get(key)
        if waiting is None:
            self.waiting[key] = [offset]
        else:
            insort(waiting, offset)
        if key in self.held_retries:
            self.woken.append(key)
        self._out_done(key)

    def _out_done(self, key: str) -> None:
        out = self._out[key]
        out[1] -= 1
        if not out[1]:
            del self._out[key]
            self.moving.discard(key)
            self._gate_changed(key)

    def _gate_changed(self, key: str) -> None:
        """The key's gate may have opened: its fresh offset and its held retries get another look."""
        fresh = self.fresh.get(key)
        if fresh is not None and key not in self.waiting:
            heapq.heappush(self.heads, fresh)
        if key in self.held_retries:
            self.woken.append(key)

    def consumers_changed(self, version: int) -> None:
        """The consumer set is now `version`: a key that waited to move may route back to its consumer."""
        self.seen_version = version
        for key in self.moving:
            self._gate_changed(key)
        self.moving.clear()
        self.woken.extend(self.held_retries)

    def take_woken(self) -> list[int]:
        """Held retries whose key's gate changed since the last call (the caller queues them again)."""
        out: list[int] = []
        held = self.held_retries
        for key in self.woken:
            out.extend(held.pop(key, ()))
        self.woken.clear()
        return out

    # -- parking ------------------------------------------------------------------------------------------
    def park(self, offset: int, version: int) -> None:
        """No attached consumer accepts the key of `offset`: hold it (and count its key's held messages as
        unmatched) until the consumer set changes from `version`."""
        self.parked.add(offset)
        self.parked_version = version
        key = self.key_of[offset]
        if key in self.unmatched:
            return
        self.unmatched.add(key)
        n, nxt, prv = 1, self._next, self._prev
        other = nxt.get(offset)
        while other is not None:
            n += 1
            other = nxt.get(other)
        other = prv.get(offset)
        while other is not None:
            n += 1
            other = prv.get(other)
        self.n_unmatched += n

    def clear_parked(self) -> list[int]:
        """The consumer set changed: forget which keys nobody accepts; returns the parked offsets in order."""
        out = sorted(self.parked)
        self.parked.clear()
        self.unmatched.clear()
        self.n_unmatched = 0
        return out

    # -- resolution ---------------------------------------------------------------------------------------
    def release(self, offset: int) -> None:
        """`offset` (sent: in flight or waiting) is resolved: unlink it and open its key's gate if it was
        the last in flight or the last waiting."""
        key = self.key_of.pop(offset)
        if self.parked:
            self.parked.discard(offset)
        prv, nxt = self._prev.pop(offset, None), self._next.pop(offset, None)
        if prv is None:
            if nxt is None:
                del self._tail[key]
            else:
                del self._prev[nxt]
        elif nxt is None:
            del self._next[prv]
            self._tail[key] = prv
        else:
            self._next[prv] = nxt
            self._prev[nxt] = prv
        if self.unmatched and key in self.unmatched:
            self.n_unmatched -= 1
            if nxt is None and prv is None:
                self.unmatched.discard(key)
        waiting = self.waiting.get(key) if self.waiting else None
        if waiting is not None and offset in waiting:
            waiting.remove(offset)
            if not waiting:
                del self.waiting[key]
                self._gate_changed(key)
            elif key in self.held_retries:
                self.woken.append(key)
        else:
            self._out_done(key)

    def release_all(self, offsets: Iterable[int]) -> None:
        """`release` for many offsets."""
        release = self.release
        for offset in offsets:
            release(offset)
