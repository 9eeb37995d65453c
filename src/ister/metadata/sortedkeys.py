"""A sorted set of strings with O(log n + chunk) inserts and deletes, for the embedded store's key index.

A plain sorted list costs O(n) per insert or delete (the tail moves): with 100,000 topics (about 500,000
keys) that is ~0.1 ms of memmove per key, and a metadata commit group applying a few hundred keys at once
held the event loop for tens of milliseconds. Here the keys live in chunks of at most 2 * CHUNK sorted
strings, found by bisecting the chunks' last keys, so a change moves at most one chunk.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable, Iterator

CHUNK = 512


class SortedKeys:
    __slots__ = ("_chunks", "_len", "_maxes")

    def __init__(self, keys: Iterable[str] = ()) -> None:
        ordered = sorted(set(keys))
        self._chunks: list[list[str]] = [ordered[i : i + CHUNK] for i in range(0, len(ordered), CHUNK)]
        self._maxes: list[str] = [chunk[-1] for chunk in self._chunks]
        self._len = len(ordered)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[str]:
        for chunk in self._chunks:
            yield from chunk

    def add(self, key: str) -> None:
        """Insert `key` (the caller knows it is absent)."""
        maxes, chunks = self._maxes, self._chunks
        if not chunks:
            chunks.append([key])
            maxes.append(key)
            self._len = 1
            return
        i = bisect_left(maxes, key)
        if i == len(maxes):
            i -= 1  # above every key: the last chunk grows
        chunk = chunks[i]
        insort(chunk, key)
        maxes[i] = chunk[-1]
        self._len += 1
        if len(chunk) > 2 * CHUNK:
            half = len(chunk) // 2
            chunks.insert(i + 1, chunk[half:])
            del chunk[half:]
            maxes[i] = chunk[-1]
            maxes.insert(i + 1, chunks[i + 1][-1])

    def discard(self, key: str) -> bool:
        """Remove `key`; False if it was absent."""
        maxes, chunks = self._maxes, self._chunks
        i = bisect_left(maxes, key)
        if i == len(maxes):
            return False
        chunk = chunks[i]
        j = bisect_left(chunk, key)
        if j == len(chunk) or chunk[j] != key:
            return False
        del chunk[j]
        self._len -= 1
        if chunk:
            maxes[i] = chunk[-1]
        else:
            del chunks[i]
            del maxes[i]
        return True

    def iter_from(self, key: str, *, inclusive: bool = True) -> Iterator[str]:
        """The keys >= `key` (> `key` when not inclusive), in order."""
        find = bisect_left if inclusive else bisect_right
        chunks = self._chunks
        i = find(self._maxes, key)
        if i == len(chunks):
            return
        yield from chunks[i][find(chunks[i], key) :]
        for j in range(i + 1, len(chunks)):
            yield from chunks[j]
