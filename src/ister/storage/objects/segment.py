"""The durable object format `data-<start>-<end>.dnb1` (docs/formats.md, "Durable objects (.dnb1)").

    body     WAL frames start..end exactly as in the WAL (core/frames.py), back to back
    index    index_count entries of (offset u64, position u64): byte position of a frame in the body
    footer   FOOTER_SIZE bytes: first, last, count, index position, index count, version, flags,
             crc32c(index + footer up to the crc), magic

A reader fetches the tail (footer and, usually, the whole index) with one suffix GET, then ranged GETs
of the body from the index entry at or before the wanted offset. Nothing here needs a broker or metadata.
"""

from __future__ import annotations

import re
import struct
from bisect import bisect_right
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ister.core.frameblock import FrameBlock, check_dense
from ister.core.frames import (
    HEADER_SIZE,
    INDEX_EVERY_BYTES,
    INDEX_EVERY_FRAMES,
    MAX_OFFSET,
    SparseIndex,
    encode_frame,
    payload_crc,
    scan_frames,
    split_dense,
)
from ister.core.publish_time import frames_time_span, merge_spans
from ister.errors import CorruptionError, InvalidArgument
from ister.limits import MiB

from .store import ObjectStore, check_key

MAGIC = b"ISTRDNB1"
VERSION = 1
# first, last, count, index_pos, index_count, version, flags, crc, magic
FOOTER = struct.Struct("<QQQQIHHI8s")
FOOTER_SIZE = FOOTER.size  # 52
_CRC_AT = FOOTER_SIZE - 12  # the crc covers the index and footer bytes [0, _CRC_AT)
INDEX_ENTRY = struct.Struct("<QQ")
INDEX_ENTRY_SIZE = INDEX_ENTRY.size  # 16
TAIL_READ = 64 * 1024  # first GET: the last 64 KiB (footer + up to ~4,000 index entries)
READ_CHUNK = 4 * MiB
SUFFIX = ".dnb1"
_NAME = re.compile(r"^data-(0|[1-9]\d{0,19})-(0|[1-9]\d{0,19})\.dnb1$")


def object_name(start: int, end: int) -> str:
    """`data-<start>-<end>.dnb1`: the first and last offset (inclusive) in decimal (docs/formats.md, "Object
    names")."""
    if not 0 <= start <= end <= MAX_OFFSET:
        raise InvalidArgument(f"invalid object range {start}..{end}")
    return f"data-{start}-{end}{SUFFIX}"


def parse_object_name(name: str) -> tuple[int, int] | None:
    """(start, end) from an object name (or a key ending in one), None if it is not one."""
    m = _NAME.match(name.rsplit("/", 1)[-1])
    if m is None:
        return None
    start, end = int(m.group(1)), int(m.group(2))
    return (start, end) if start <= end <= MAX_OFFSET else None


def object_key(prefix_for_topic: str, start: int, end: int) -> str:
    """`<prefix>/data-<start>-<end>.dnb1` (the prefix may be empty)."""
    name = object_name(start, end)
    prefix = prefix_for_topic.strip("/")
    return check_key(f"{prefix}/{name}" if prefix else name)


def topic_object_prefix(namespace: str, topic: str) -> str:
    """The default key prefix of a topic's objects, `<namespace>/<topic>` (docs/formats.md, "Object names"),
    relative to the store URL (so `s3://bucket/ister` puts them under `ister/<namespace>/<topic>/` in the
    bucket)."""
    return f"{namespace}/{topic}"


async def list_segments(store: ObjectStore, prefix_for_topic: str) -> list[tuple[int, int, str]]:
    """(start, end, key) of the .dnb1 objects directly under a topic's prefix, by start offset. Needs no
    metadata (the Spark connector can find a topic's objects this way); other files are ignored."""
    prefix = prefix_for_topic.strip("/")
    found = []
    for info in await store.list(prefix):
        rest = info.key[len(prefix) + 1 :] if prefix else info.key
        parsed = parse_object_name(rest) if "/" not in rest else None
        if parsed is not None:
            found.append((parsed[0], parsed[1], info.key))
    found.sort()
    return found


_PARQUET_NAME = re.compile(r"^data-(0|[1-9]\d{0,19})-(0|[1-9]\d{0,19})\.parquet$")


def parse_parquet_name(name: str) -> tuple[int, int] | None:
    """(start, end) from a Parquet copy's name (or a key ending in one), None if it is not one."""
    m = _PARQUET_NAME.match(name.rsplit("/", 1)[-1])
    if m is None:
        return None
    start, end = int(m.group(1)), int(m.group(2))
    return (start, end) if start <= end <= MAX_OFFSET else None


async def list_topic_files(
    store: ObjectStore, prefix_for_topic: str
) -> tuple[list[tuple[int, int, str]], dict[tuple[int, int], str]]:
    """One listing of a topic's prefix: its .dnb1 objects as `list_segments` gives them, and the keys of
    their Parquet copies (docs/formats.md) by (start, end); a copy whose object is not listed is left out
    (an export that stopped between the two puts)."""
    prefix = prefix_for_topic.strip("/")
    found = []
    copies: dict[tuple[int, int], str] = {}
    for info in await store.list(prefix):
        rest = info.key[len(prefix) + 1 :] if prefix else info.key
        if "/" in rest:
            continue
        parsed = parse_object_name(rest)
        if parsed is not None:
            found.append((parsed[0], parsed[1], info.key))
        elif (copy := parse_parquet_name(rest)) is not None:
            copies[copy] = info.key
    found.sort()
    have = {(a, b) for a, b, _ in found}
    return found, {r: k for r, k in copies.items() if r in have}


@dataclass(frozen=True, slots=True)
class Footer:
    first_offset: int
    last_offset: int
    count: int
    index_pos: int  # == body size
    index_count: int
    version: int = VERSION
    flags: int = 0

    @property
    def object_size(self) -> int:
        return self.index_pos + self.index_count * INDEX_ENTRY_SIZE + FOOTER_SIZE


def encode_tail(footer: Footer, index: list[tuple[int, int]]) -> bytes:
    """Index entries + footer (with its crc32c over both)."""
    if len(index) != footer.index_count:
        raise ValueError("index_count does not match the index")
    idx = b"".join(INDEX_ENTRY.pack(o, p) for o, p in index)
    head = FOOTER.pack(
        footer.first_offset,
        footer.last_offset,
        footer.count,
        footer.index_pos,
        footer.index_count,
        footer.version,
        footer.flags,
        0,
        MAGIC,
    )[:_CRC_AT]
    crc = payload_crc(idx + head)
    return idx + head + struct.pack("<I", crc) + MAGIC


def decode_footer(raw: bytes, where: str) -> tuple[Footer, int]:
    """Parse and sanity-check a footer (not its crc): (footer, stored crc)."""
    if len(raw) != FOOTER_SIZE:
        raise CorruptionError(f"{where}: footer is {len(raw)} bytes, expected {FOOTER_SIZE}")
    first, last, count, index_pos, index_count, version, flags, crc, magic = FOOTER.unpack(raw)
    if magic != MAGIC:
        raise CorruptionError(f"{where}: bad magic {magic!r} (not a .dnb1 object)")
    if version != VERSION:
        raise CorruptionError(f"{where}: unsupported .dnb1 version {version}")
    footer = Footer(first, last, count, index_pos, index_count, version, flags)
    if first > last or count != last - first + 1 or index_count < 1 or index_count > count:
        raise CorruptionError(f"{where}: inconsistent footer {footer}")
    if index_pos < count * HEADER_SIZE:
        raise CorruptionError(f"{where}: body of {index_pos} bytes cannot hold {count} frames")
    return footer, crc


def decode_index(raw: bytes, footer: Footer, where: str) -> list[tuple[int, int]]:
    """Index entries, checked: first is (first_offset, 0), strictly increasing, inside the body."""
    entries = [(int(o), int(p)) for o, p in INDEX_ENTRY.iter_unpack(raw)]
    if len(entries) != footer.index_count:
        raise CorruptionError(
            f"{where}: index holds {len(entries)} entries, footer says {footer.index_count}"
        )
    if entries[0] != (footer.first_offset, 0):
        raise CorruptionError(f"{where}: first index entry {entries[0]} is not ({footer.first_offset}, 0)")
    prev_o, prev_p = entries[0]
    for o, p in entries[1:]:
        if o <= prev_o or p <= prev_p or o > footer.last_offset or p >= footer.index_pos:
            raise CorruptionError(f"{where}: bad index entry ({o}, {p}) after ({prev_o}, {prev_p})")
        prev_o, prev_p = o, p
    return entries


class SegmentBuilder:
    """Streaming builder: feed the body bytes (WAL frames from `first_offset` on) in pieces of any size,
    get back the validated bytes to upload; `finish()` returns the index + footer.

    Every frame is checked (length limit, dense offsets, crc32c) before its bytes are released, so a
    corrupt source never becomes an object.
    """

    def __init__(
        self,
        first_offset: int,
        *,
        index_every_frames: int = INDEX_EVERY_FRAMES,
        index_every_bytes: int = INDEX_EVERY_BYTES,
        where: str = "segment",
    ) -> None:
        if not 0 <= first_offset <= MAX_OFFSET:
            raise ValueError(f"invalid first offset {first_offset}")
        self.first_offset = first_offset
        self.next_offset = first_offset
        self.size = 0  # body bytes released so far
        self._index = SparseIndex(index_every_frames, index_every_bytes)
        self._carry = b""
        self._where = where
        self._finished = False
        self.time_span: tuple[int, int] | None = None  # (min, max) publish time of the frames fed

    @property
    def count(self) -> int:
        return self.next_offset - self.first_offset

    @property
    def index(self) -> list[tuple[int, int]]:
        """The sparse index so far: (offset, byte position in the object) pairs."""
        return list(self._index.entries)

    def feed(self, data: bytes | bytearray | memoryview) -> bytes:
        """Validate more body bytes; returns the prefix made of complete frames (may be empty)."""
        if self._finished:
            raise ValueError("builder already finished")
        buf = self._carry + bytes(data) if self._carry else bytes(data)
        res = scan_frames(buf, self.size, self.next_offset, collect=False, index=self._index)
        if res.stop in ("crc", "gap", "too_large"):
            raise CorruptionError(
                f"{self._where}: {res.stop} at byte {res.end_pos} (expected offset {res.next_offset})"
            )
        assert res.next_offset is not None
        self.next_offset = res.next_offset
        self.size = res.end_pos
        self._carry = buf[res.safe_length :]
        self.time_span = merge_spans(self.time_span, frames_time_span(buf, res.safe_length))
        return buf[: res.safe_length]

    def finish(self) -> bytes:
        """Index + footer. Raises CorruptionError if a partial frame is left, ValueError if there was none."""
        if self._carry:
            raise CorruptionError(
                f"{self._where}: {len(self._carry)} bytes of an incomplete frame at byte {self.size}"
            )
        if self.count == 0:
            raise ValueError("a .dnb1 object needs at least one frame")
        self._finished = True
        entries = list(self._index.entries)
        footer = Footer(self.first_offset, self.next_offset - 1, self.count, self.size, len(entries))
        return encode_tail(footer, entries)


def build_segment(
    frames: Iterable[tuple[int, bytes | bytearray | memoryview]],
    *,
    index_every_frames: int = INDEX_EVERY_FRAMES,
    index_every_bytes: int = INDEX_EVERY_BYTES,
) -> bytes:
    """A whole object from (offset, payload) pairs with dense, increasing offsets."""
    builder: SegmentBuilder | None = None
    parts: list[bytes] = []
    for offset, payload in frames:
        if builder is None:
            builder = SegmentBuilder(
                offset, index_every_frames=index_every_frames, index_every_bytes=index_every_bytes
            )
        elif offset != builder.next_offset:
            raise ValueError(f"offsets must be dense: got {offset}, expected {builder.next_offset}")
        parts.append(builder.feed(encode_frame(offset, bytes(payload))))
    if builder is None:
        raise ValueError("a .dnb1 object needs at least one frame")
    parts.append(builder.finish())
    return b"".join(parts)


@dataclass(frozen=True, slots=True)
class SegmentLayout:
    """What the tail of an object says: its footer and sparse index."""

    footer: Footer
    index: list[tuple[int, int]]
    tail: bytes  # the bytes fetched by the first GET (the end of the object)
    size: int  # object size

    def body_from_tail(self, start: int, end: int) -> bytes | None:
        """Body bytes [start, end) if the first GET already fetched them."""
        tail_start = self.size - len(self.tail)
        if start >= tail_start:
            return self.tail[start - tail_start : end - tail_start]
        return None

    def seek(self, offset: int) -> tuple[int, int]:
        """(offset, byte position) of the index entry at or before `offset`."""
        i = bisect_right(self.index, offset, key=lambda e: e[0]) - 1
        return self.index[max(i, 0)]

    def stop_after(self, offset: int) -> tuple[int, int]:
        """(offset, byte position) of the first index entry after `offset`, or (last+1, body end)."""
        i = bisect_right(self.index, offset, key=lambda e: e[0])
        if i < len(self.index):
            return self.index[i]
        return self.footer.last_offset + 1, self.footer.index_pos


async def read_layout(store: ObjectStore, key: str, *, tail_read: int = TAIL_READ) -> SegmentLayout:
    """Fetch and validate the footer and index of an object (one GET, two for a very large index)."""
    where = f"object {key!r}"
    tail, size = await store.get_tail(key, max(tail_read, FOOTER_SIZE))
    if size < FOOTER_SIZE + INDEX_ENTRY_SIZE + HEADER_SIZE:
        raise CorruptionError(f"{where}: {size} bytes is too small for a .dnb1 object")
    footer, crc = decode_footer(tail[-FOOTER_SIZE:], where)
    if footer.object_size != size:
        raise CorruptionError(f"{where}: size {size} does not match its footer ({footer.object_size})")
    index_len = footer.index_count * INDEX_ENTRY_SIZE
    index_at = footer.index_pos
    if size - len(tail) <= index_at:
        raw_index = tail[index_at - (size - len(tail)) : len(tail) - FOOTER_SIZE]
    else:
        raw_index = await store.get_range(key, index_at, index_at + index_len)
        if len(raw_index) != index_len:
            raise CorruptionError(f"{where}: short read of the index ({len(raw_index)} of {index_len})")
    if payload_crc(raw_index + tail[-FOOTER_SIZE:][:_CRC_AT]) != crc:
        raise CorruptionError(f"{where}: footer/index checksum mismatch")
    named = parse_object_name(key)
    if named is not None and named != (footer.first_offset, footer.last_offset):
        raise CorruptionError(
            f"{where}: holds offsets {footer.first_offset}..{footer.last_offset}, its name says "
            f"{named[0]}..{named[1]}"
        )
    index = decode_index(raw_index, footer, where)
    return SegmentLayout(footer, index, tail, size)


async def read_segment(
    store: ObjectStore,
    key: str,
    start_offset: int | None = None,
    end_offset: int | None = None,
    *,
    chunk_bytes: int = READ_CHUNK,
) -> AsyncIterator[list[tuple[int, bytes]]]:
    """Records of one object, in batches of consecutive (offset, payload) pairs.

    `start_offset`/`end_offset` (both inclusive, None = the object's first/last) select a range; offsets
    outside the object are clamped to it. Seeks with the object's index and reads at most `chunk_bytes`
    per ranged GET; a batch holds the records of one chunk. Every frame's crc32c and offset is checked;
    any mismatch raises CorruptionError (nothing after it is returned).
    """
    async for first, payloads in read_segment_runs(
        store, key, start_offset, end_offset, chunk_bytes=chunk_bytes
    ):
        yield [(first + i, p) for i, p in enumerate(payloads)]


async def read_segment_runs(
    store: ObjectStore,
    key: str,
    start_offset: int | None = None,
    end_offset: int | None = None,
    *,
    chunk_bytes: int = READ_CHUNK,
) -> AsyncIterator[tuple[int, list[bytes]]]:
    """As `read_segment`, but each batch is (first offset, payloads): objects are dense, so the offsets
    need not be spelled out (the columnar readers, e.g. Spark's, take this form)."""
    bounds = await _bounds(store, key, start_offset, end_offset, chunk_bytes)
    if bounds is None:
        return
    layout, lo, hi = bounds
    async for first, _, payloads in _read_body(store, key, layout, lo, hi, chunk_bytes):
        if first < lo:  # the index entry the seek used lies before lo
            payloads = payloads[lo - first :]
            first = lo
        if payloads:
            yield first, payloads


async def read_segment_blocks(
    store: ObjectStore,
    key: str,
    start_offset: int | None = None,
    end_offset: int | None = None,
    *,
    chunk_bytes: int = READ_CHUNK,
) -> AsyncIterator[FrameBlock]:
    """As `read_segment`, but each batch is a `FrameBlock`: the frames as they sit in the object, every
    frame's crc32c and offset checked once here and no record copied (the subscription driver hands runs of
    them to batch-API consumers as they are)."""
    bounds = await _bounds(store, key, start_offset, end_offset, chunk_bytes)
    if bounds is None:
        return
    layout, lo, hi = bounds
    async for first, buf, starts in _read_body(store, key, layout, lo, hi, chunk_bytes, check_dense):
        if first < lo:  # the index entry the seek used lies before lo
            starts = starts[lo - first :]
            first = lo
        if len(starts) > 1:
            yield FrameBlock(first, buf, starts)


Split = Callable[[bytes, int, int], tuple[list[Any], int, int, str | None]]


async def _bounds(
    store: ObjectStore, key: str, start_offset: int | None, end_offset: int | None, chunk_bytes: int
) -> tuple[SegmentLayout, int, int] | None:
    """The object's layout and the asked range clamped to its offsets; None when they do not meet."""
    if chunk_bytes < 1:
        raise ValueError("chunk_bytes must be >= 1")
    layout = await read_layout(store, key)
    footer = layout.footer
    lo = footer.first_offset if start_offset is None else max(start_offset, footer.first_offset)
    hi = footer.last_offset if end_offset is None else min(end_offset, footer.last_offset)
    return None if lo > hi else (layout, lo, hi)


async def _read_body(
    store: ObjectStore,
    key: str,
    layout: SegmentLayout,
    lo: int,
    hi: int,
    chunk_bytes: int,
    split: Split = split_dense,
) -> AsyncIterator[tuple[int, bytes, list[Any]]]:
    """(first offset, buffer, what `split` made of it) per ranged GET, from the index entry at or before `lo`
    (so `first` may be below `lo`) through `hi`; every frame checked by `split`."""
    where = f"object {key!r}"
    expect, pos = layout.seek(lo)
    stop_offset, stop_pos = layout.stop_after(hi)
    buf = b""  # body bytes from buf_pos on, not yet scanned
    buf_pos = pos
    want = chunk_bytes
    while expect <= hi:
        read_at = buf_pos + len(buf)
        if read_at >= stop_pos:
            raise CorruptionError(f"{where}: body ends at byte {read_at} inside the frame of offset {expect}")
        read_end = min(stop_pos, read_at + want)
        data = layout.body_from_tail(read_at, read_end)
        if data is None:
            data = await store.get_range(key, read_at, read_end)
        if len(data) != read_end - read_at:
            raise CorruptionError(f"{where}: short read at byte {read_at} ({len(data)} bytes)")
        buf = buf + data if buf else data
        items, used, needed, problem = split(buf, expect, hi - expect + 1)
        count = len(items) if split is split_dense else len(items) - 1
        if problem is not None:
            raise CorruptionError(
                f"{where}: {problem} at byte {buf_pos + used} (expected offset {expect + count})"
            )
        first = expect
        expect += count
        whole = buf
        buf = buf[used:]
        buf_pos += used
        want = max(chunk_bytes, needed)
        if count:
            yield first, whole, items
    # Everything up to `hi` was read and checked. If `hi` is the last frame before an index entry (or the
    # last of the object), that frame must end exactly where the entry (or the body) begins.
    if stop_offset == hi + 1 and buf_pos != stop_pos:
        raise CorruptionError(
            f"{where}: the frame of offset {hi} ends at byte {buf_pos}, the index says {stop_pos}"
        )


__all__ = [
    "FOOTER_SIZE",
    "INDEX_ENTRY_SIZE",
    "MAGIC",
    "VERSION",
    "Footer",
    "SegmentBuilder",
    "SegmentLayout",
    "build_segment",
    "decode_footer",
    "encode_tail",
    "list_segments",
    "object_key",
    "object_name",
    "parse_object_name",
    "read_layout",
    "read_segment",
    "read_segment_blocks",
    "read_segment_runs",
    "topic_object_prefix",
]
