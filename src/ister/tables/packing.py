"""Stored records as three objects for the table worker process: offsets, lengths and the payloads back to
back. Pickling them costs about half of pickling a tuple and a bytes object per record, and it is the broker
that pays it (docs/benchmarks.md, "Topics as Iceberg tables"). No heavy imports: the broker loads this."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from itertools import accumulate
from operator import itemgetter

_first = itemgetter(0)
_second = itemgetter(1)


def pack(records: Sequence[tuple[int, bytes]]) -> tuple[array[int], array[int], bytes]:
    payloads = list(map(_second, records))
    return array("q", map(_first, records)), array("q", map(len, payloads)), b"".join(payloads)


def unpack(offsets: array[int], lengths: array[int], blob: bytes) -> list[tuple[int, bytes]]:
    ends = list(accumulate(lengths))
    return [(o, blob[e - n : e]) for o, n, e in zip(offsets, lengths, ends, strict=True)]


__all__ = ["pack", "unpack"]
