"""Partition routing: round-robin per batch for unkeyed messages, FNV-1a for keyed ones.

The key hash is the one the official Danube clients use (Rust, Go, Python): 64-bit FNV-1a over the UTF-8
bytes of the key, partition = hash % partitions. So a key lands on the same partition whichever client
published it, and per-key order holds within that partition.
"""

from __future__ import annotations

FNV_OFFSET_BASIS = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
_MASK = 0xFFFFFFFFFFFFFFFF


def fnv1a_64(key: str) -> int:
    h = FNV_OFFSET_BASIS
    for byte in key.encode():
        h = ((h ^ byte) * FNV_PRIME) & _MASK
    return h


class Router:
    """Chooses a partition index. Unkeyed messages stay on the current partition until its open batch is
    sealed (`advance`), so batches stay large; keyed messages always go to `fnv1a_64(key) % n`."""

    __slots__ = ("_cache", "current", "n")

    def __init__(self, partitions: int) -> None:
        if partitions < 1:
            raise ValueError("a topic has at least one partition")
        self.n = partitions
        self.current = 0
        self._cache: dict[str, int] = {}

    def for_key(self, key: str) -> int:
        if self.n == 1:
            return 0
        index = self._cache.get(key)
        if index is None:
            index = fnv1a_64(key) % self.n
            if len(self._cache) < 65536:  # bounded memo: hot keys hit it, a key flood does not grow it
                self._cache[key] = index
        return index

    def advance(self, sealed: int) -> None:
        """The batch of partition `sealed` was sealed: unkeyed messages move to the next partition."""
        if sealed == self.current and self.n > 1:
            self.current = (self.current + 1) % self.n
