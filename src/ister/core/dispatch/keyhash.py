"""Key-Shared routing: the 32-bit key hash, the consumer ring and key-filter globs.

The hash matches Danube's so a key lands on the same ring position in both brokers:
FNV-1a 64 over the UTF-8 bytes, XOR-folded to 32 bits, then murmur3's fmix32 finaliser.
Each consumer owns VIRTUAL_NODES ring points at H(f"{consumer_id}-{i}"); a key belongs to the first point
whose hash is >= H(key), wrapping round. The ring depends only on the consumer ids, so a consumer that
leaves and comes back with the same id gets the same keys back.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Collection, Iterable, Sequence
from functools import lru_cache

VIRTUAL_NODES = 100

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_M64 = 0xFFFFFFFFFFFFFFFF
_M32 = 0xFFFFFFFF


def fnv1a64(data: bytes) -> int:
    h = _FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * _FNV_PRIME) & _M64
    return h


def fmix32(x: int) -> int:
    x &= _M32
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & _M32
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & _M32
    x ^= x >> 16
    return x


def _hash_uncached(value: str) -> int:
    h = fnv1a64(value.encode("utf-8"))
    return fmix32((h >> 32) ^ (h & _M32))


_cached_hash = lru_cache(maxsize=65_536)(_hash_uncached)


def key_hash(value: str) -> int:
    """The 32-bit ring hash of a string (routing key or virtual-node name)."""
    if len(value) > 256:  # keep the cache's memory bounded by short keys only
        return _hash_uncached(value)
    return _cached_hash(value)


@lru_cache(maxsize=4_096)
def consumer_nodes(consumer_id: int) -> tuple[int, ...]:
    """The ring points of one consumer."""
    return tuple(_hash_uncached(f"{consumer_id}-{i}") for i in range(VIRTUAL_NODES))


class HashRing:
    """An immutable consistent-hash ring over a set of consumer ids."""

    __slots__ = ("_hashes", "_owners")

    def __init__(self, consumer_ids: Iterable[int]) -> None:
        nodes = sorted((h, cid) for cid in set(consumer_ids) for h in consumer_nodes(cid))
        self._hashes = [h for h, _ in nodes]
        self._owners = [cid for _, cid in nodes]

    def __len__(self) -> int:
        return len(self._hashes)

    def lookup(self, key: str, eligible: Collection[int] | None = None) -> int | None:
        """The owner of `key`; with `eligible`, as if the ring held only those consumers."""
        if not self._hashes:
            return None
        n = len(self._hashes)
        start = bisect_left(self._hashes, key_hash(key))
        if eligible is None:
            return self._owners[start % n]
        for i in range(n):
            owner = self._owners[(start + i) % n]
            if owner in eligible:
                return owner
        return None


@lru_cache(maxsize=1_024)
def compile_glob(pattern: str) -> re.Pattern[str]:
    """Translate a key filter: `*` any run (also empty), `?` one character, anything else literal."""
    parts: list[str] = []
    for ch in pattern:
        if ch == "*":
            if not parts or parts[-1] != ".*":
                parts.append(".*")
        elif ch == "?":
            parts.append(".")
        else:
            parts.append(re.escape(ch))
    return re.compile("".join(parts), re.DOTALL)


def glob_match(pattern: str, key: str) -> bool:
    """Whole-key match of one key filter."""
    return compile_glob(pattern).fullmatch(key) is not None


def filters_match(filters: Sequence[str], key: str) -> bool:
    """A consumer with no filters takes every key; otherwise at least one filter must match."""
    return not filters or any(glob_match(p, key) for p in filters)
