"""Parquet copies of durable objects: `data-<start>-<end>.parquet` next to `data-<start>-<end>.dnb1`
(docs/formats.md, "Parquet copies").

The file holds the object's records in the Spark source's row layout (docs/spark.md, "Rows"), headers
included, one row per offset in offset order. It is a derived, optional copy: the `.dnb1` object stays the
source of truth, a reader uses the Parquet file only when the `.dnb1` of the same range is listed too and
the file checks out (`check_table`, `check_metadata`), and falls back to the object otherwise.

Needs pyarrow (the `spark` extra): the broker imports this module only when `storage.durable.parquet` is on.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ister.core.compression import CompressionError, plain
from ister.core.frames import split_dense
from ister.core.record import NO_ATTRIBUTES, LeanMessage, array_header
from ister.errors import CorruptionError, InvalidArgument

from .segment import object_name, parse_parquet_name
from .store import check_key

PARQUET_SUFFIX = ".parquet"
# Records per row group: small enough that a reader of part of a file skips most of it by the offset
# column's statistics, large enough that per-group overhead does not matter.
ROW_GROUP_ROWS = 64 * 1024

_decode_lean = msgspec.msgpack.Decoder(list[LeanMessage]).decode  # attributes stay raw
_decode_attrs = msgspec.msgpack.Decoder(dict[str, str]).decode

HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
FIELDS = [
    ("key", pa.binary()),
    ("value", pa.binary()),
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("timestamp", pa.timestamp("us", tz="UTC")),
    ("timestampType", pa.int32()),
    ("producer", pa.string()),
    ("schemaId", pa.int64()),
    ("schemaVersion", pa.int32()),
]
BASE_COLUMNS = [name for name, _ in FIELDS]
_SCHEMAS = {
    False: pa.schema([pa.field(n, t) for n, t in FIELDS]),
    True: pa.schema([*(pa.field(n, t) for n, t in FIELDS), pa.field("headers", HEADERS_TYPE)]),
}


def arrow_schema(include_headers: bool) -> pa.Schema:
    return _SCHEMAS[include_headers]


def parquet_name(start: int, end: int) -> str:
    return object_name(start, end).removesuffix(".dnb1") + PARQUET_SUFFIX


def parquet_key(dnb1_key: str) -> str:
    """The Parquet copy's key: the object's key with `.parquet` for `.dnb1` (same directory, same range)."""
    if not dnb1_key.endswith(".dnb1"):
        raise InvalidArgument(f"not a durable object key: {dnb1_key!r}")
    return check_key(dnb1_key.removesuffix(".dnb1") + PARQUET_SUFFIX)


def to_batch(
    topic: str, partition: int, offsets: Sequence[int], records: Sequence[bytes], include_headers: bool
) -> pa.RecordBatch:
    """One Arrow batch from stored records and their offsets; the records are decoded in one msgspec call
    (attributes left raw) and each column is built by C-level maps (this is the per-row cost of every
    Python reader, and of writing a Parquet copy)."""
    n = len(records)
    try:
        plain_records = list(map(plain, records))  # records stored compressed: decompressed (no copy else)
    except CompressionError as exc:
        raise CorruptionError(f"{topic}: a stored compressed record does not decompress: {exc}") from None
    messages: list[LeanMessage] = _decode_lean(array_header(n) + b"".join(plain_records))
    columns = [
        # str -> binary is a cast of the same UTF-8 bytes: no Python-level encode per key
        pa.array(list(map(_routing_key, messages)), pa.string()).cast(pa.binary()),
        pa.array(list(map(_payload, messages)), pa.binary()),
        pa.repeat(pa.scalar(topic, pa.string()), n) if n else pa.array([], pa.string()),
        pa.repeat(pa.scalar(partition, pa.int32()), n) if n else pa.array([], pa.int32()),
        pa.array(offsets, pa.int64()),
        pa.array(list(map(_publish_time, messages)), pa.int64())
        .cast(pa.timestamp("ms", tz="UTC"))
        .cast(pa.timestamp("us", tz="UTC")),
        pa.repeat(pa.scalar(0, pa.int32()), n) if n else pa.array([], pa.int32()),
        pa.array(list(map(_producer, messages)), pa.string()),
        pa.array(list(map(_schema_id, messages)), pa.int64()),
        pa.array(list(map(_schema_version, messages)), pa.int32()),
    ]
    if include_headers:
        columns.append(_headers(list(map(_attributes, messages))))
    return pa.RecordBatch.from_arrays(columns, schema=arrow_schema(include_headers))


def _headers(raws: list[msgspec.Raw]) -> pa.Array:
    """The headers column from raw attribute maps: only records that have attributes are decoded (most
    have none, and a dict per record is the largest part of a full decode)."""
    if all(r == NO_ATTRIBUTES for r in raws):
        offsets = pa.array([0] * (len(raws) + 1), pa.int32())
        return pa.ListArray.from_arrays(offsets, pa.array([], HEADERS_TYPE.value_type), type=HEADERS_TYPE)
    headers = [
        [] if r == NO_ATTRIBUTES else [{"key": k, "value": v.encode()} for k, v in _decode_attrs(r).items()]
        for r in raws
    ]
    return pa.array(headers, HEADERS_TYPE)


_routing_key = attrgetter("routing_key")
_payload = attrgetter("payload")
_publish_time = attrgetter("publish_time")
_producer = attrgetter("producer_name")
_schema_id = attrgetter("schema_id")
_schema_version = attrgetter("schema_version")
_attributes = attrgetter("attributes")


class ParquetEncoder:
    """Builds the Parquet copy of one object from its WAL frames, fed in chunks of any size (frames may
    be split between chunks). Blocking and CPU-bound: run it in a thread."""

    def __init__(self, topic: str, partition: int, first: int, last: int) -> None:
        self.topic, self.partition = topic, partition
        self.first, self.last = first, last
        self.next_offset = first
        self._carry = b""
        self._sink = pa.BufferOutputStream()
        # Page checksums let a reader that checks them (Spark with parquet.page.verify-checksum.enabled)
        # refuse a damaged page instead of returning wrong rows.
        self._writer = pq.ParquetWriter(
            self._sink, arrow_schema(True), compression="snappy", write_page_checksum=True
        )
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0

    def feed(self, data: bytes) -> None:
        buf = self._carry + data if self._carry else data
        remaining = self.last + 1 - self.next_offset
        payloads, used, _needed, problem = split_dense(buf, self.next_offset, remaining)
        if problem is not None:
            raise CorruptionError(
                f"frames of {self.topic} at offset {self.next_offset + len(payloads)}: {problem}"
            )
        if payloads:
            offsets = range(self.next_offset, self.next_offset + len(payloads))
            self._pending.append(to_batch(self.topic, self.partition, offsets, payloads, True))
            self._pending_rows += len(payloads)
            self.next_offset += len(payloads)
            if self._pending_rows >= ROW_GROUP_ROWS:
                self._flush()
        self._carry = bytes(buf[used:])

    def _flush(self) -> None:
        if self._pending:
            self._writer.write_table(pa.Table.from_batches(self._pending), row_group_size=1 << 30)
            self._pending, self._pending_rows = [], 0

    def finish(self) -> bytes:
        if self.next_offset != self.last + 1 or self._carry:
            raise CorruptionError(
                f"frames of {self.topic} end at {self.next_offset - 1} (+{len(self._carry)} bytes), "
                f"expected {self.last}"
            )
        self._flush()
        self._writer.close()
        return bytes(self._sink.getvalue().to_pybytes())


def encode(topic: str, partition: int, first: int, last: int, frames: bytes) -> bytes:
    """The Parquet copy of frames first..last (all of them, back to back)."""
    enc = ParquetEncoder(topic, partition, first, last)
    enc.feed(frames)
    return enc.finish()


def check_metadata(meta: Any, first: int, last: int) -> str | None:
    """Why a Parquet copy's footer does not fit the object first..last (None: it fits). Checks the schema,
    the row count and the offset column's bounds, which is what a reader relies on to skip nothing and
    read nothing twice."""
    schema = meta.schema.to_arrow_schema()
    if not schema.remove_metadata().equals(arrow_schema(True)):
        return f"schema {schema} is not the row layout"
    if meta.num_rows != last - first + 1:
        return f"{meta.num_rows} rows for offsets {first}..{last}"
    column = BASE_COLUMNS.index("offset")
    low: int | None = None
    high: int | None = None
    for i in range(meta.num_row_groups):
        stats = meta.row_group(i).column(column).statistics
        if stats is None or not stats.has_min_max:
            return "no offset statistics"
        low = stats.min if low is None else min(low, stats.min)
        high = stats.max if high is None else max(high, stats.max)
    if meta.num_rows and (low, high) != (first, last):
        return f"offsets {low}..{high}, expected {first}..{last}"
    return None


FOOTER_READ = 64 * 1024  # one suffix GET holds the footer of a copy of up to ~1,000 row groups


def footer_metadata(tail: bytes) -> Any:
    """The FileMetaData from a copy's last bytes, or None when `tail` does not hold the whole footer (or
    is not a Parquet footer at all)."""
    if len(tail) < 8 or tail[-4:] != b"PAR1":
        return None
    length = int.from_bytes(tail[-8:-4], "little")
    if length + 8 > len(tail):
        return None
    try:
        return pq.read_metadata(pa.BufferReader(b"PAR1" + tail[-(length + 8) :]))
    except Exception:  # a damaged footer
        return None


def read_table(data: bytes, first: int, last: int) -> pa.Table:
    """A Parquet copy's rows, checked to be exactly offsets first..last in order (CorruptionError)."""
    try:
        reader = pq.ParquetFile(pa.BufferReader(data))
        problem = check_metadata(reader.metadata, first, last)
        if problem is not None:
            raise CorruptionError(f"Parquet copy of {first}..{last}: {problem}")
        table = reader.read()
    except CorruptionError:
        raise
    except Exception as exc:  # pyarrow raises several kinds for damaged files
        raise CorruptionError(f"Parquet copy of {first}..{last} is unreadable: {exc}") from exc
    expected = pa.array(range(first, last + 1), pa.int64())
    if not pc.all(pc.equal(table.column("offset"), expected)).as_py():
        raise CorruptionError(f"Parquet copy of {first}..{last}: offsets are not {first}..{last} in order")
    return table


__all__ = [
    "BASE_COLUMNS",
    "HEADERS_TYPE",
    "PARQUET_SUFFIX",
    "ParquetEncoder",
    "arrow_schema",
    "check_metadata",
    "encode",
    "footer_metadata",
    "parquet_key",
    "parquet_name",
    "parse_parquet_name",
    "read_table",
    "to_batch",
]
