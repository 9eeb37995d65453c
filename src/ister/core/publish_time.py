"""Publish times of stored records without decoding them whole, and the publish-time search rule.

A stored record is the msgpack array `[payload: bin, publish_time_ms: uint, ...]` (core/record.py); the
publish time is read from its header bytes, so finding a unit's publish-time range or probing a record
copies no payload. Publish times are the producers' clocks: not guaranteed to grow with the offset. The
time lookup (storage/time_lookup.py) treats them as non-decreasing, as Kafka's and Pulsar's do: it answers
the first offset whose record has a publish time >= T, given that every record before the answer that it
looked at was < T.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import msgspec

from ister.core.compression import MARK, CompressionError, unwrap
from ister.core.frames import HEADER, HEADER_SIZE

_U8 = struct.Struct(">B").unpack_from
_U16 = struct.Struct(">H").unpack_from
_U32 = struct.Struct(">I").unpack_from
_U64 = struct.Struct(">Q").unpack_from


class _Head(msgspec.Struct, array_like=True):
    payload: msgspec.Raw
    publish_time: int


_head = msgspec.msgpack.Decoder(_Head)


def publish_time_of(record: bytes | memoryview | msgspec.Raw) -> int | None:
    """The publish time (Unix ms) of one stored record, or None when it is not a well-formed record."""
    if not isinstance(record, bytes | memoryview):
        record = memoryview(record)  # a msgspec.Raw, as WAL readers hand some records out
    try:
        first = record[0]
        if 0x90 <= first <= 0x9F:
            pos = 1
        elif first == 0xDC:
            pos = 3
        elif first == 0xDD:
            pos = 5
        else:
            return _slow(record)
        tag = record[pos]
        if tag == 0xC4:
            pos += 2 + _U8(record, pos + 1)[0]
        elif tag == 0xC5:
            pos += 3 + _U16(record, pos + 1)[0]
        elif tag == 0xC6:
            pos += 5 + _U32(record, pos + 1)[0]
        else:
            return _slow(record)
        tag = record[pos]
        if tag < 0x80:
            return int(tag)
        if tag == 0xCC:
            return int(_U8(record, pos + 1)[0])
        if tag == 0xCD:
            return int(_U16(record, pos + 1)[0])
        if tag == 0xCE:
            return int(_U32(record, pos + 1)[0])
        if tag == 0xCF:
            return int(_U64(record, pos + 1)[0])
        return _slow(record)
    except (IndexError, struct.error):
        return None


def _slow(record: bytes | memoryview) -> int | None:
    try:
        if record[0] == MARK:  # a compressed record: its header is inside the codec's bytes
            record = unwrap(record)
        t = _head.decode(record).publish_time
    except CompressionError:
        return None
    except (msgspec.DecodeError, msgspec.ValidationError, TypeError):
        return None
    return t if t >= 0 else None


def frames_time_span(buf: bytes | memoryview, end: int | None = None) -> tuple[int, int] | None:
    """(min, max) publish time of the whole frames in `buf[:end]` (already checked: offsets and CRCs), or
    None when none of them carries a readable publish time."""
    mv = buf if isinstance(buf, memoryview) else memoryview(buf)
    stop = len(mv) if end is None else end
    unpack = HEADER.unpack_from
    lo = hi = -1
    pos = 0
    while pos + HEADER_SIZE <= stop:
        _, length, _ = unpack(mv, pos)
        body = pos + HEADER_SIZE
        t = publish_time_of(mv[body : body + length])
        if t is not None:
            if lo < 0 or t < lo:
                lo = t
            if t > hi:
                hi = t
        pos = body + length
    return None if lo < 0 else (lo, hi)


def merge_spans(a: tuple[int, int] | None, b: tuple[int, int] | None) -> tuple[int, int] | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a[0], b[0]), max(a[1], b[1])


def first_unit(maxima: Sequence[int | None], t_ms: int) -> int:
    """Index of the first unit whose latest publish time is >= `t_ms` (a unit without a known maximum is
    searched, never skipped); len(maxima) when every unit is older."""
    for i, hi in enumerate(maxima):
        if hi is None or hi >= t_ms:
            return i
    return len(maxima)
