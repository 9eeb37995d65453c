"""Reading one offset range: exported objects straight from object storage, the rest from the broker.

Runs in Spark's Python workers (no event loop there): object reads drive the async segment reader on a
private loop; the not-yet-exported tail comes through `BlockingClient.read` on the worker's shared client.
Both yield the stored records as they are, so a replayed range produces the same rows, which is what makes
the source exactly-once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from ister.core.compression import missing_dictionary
from ister.core.stream_offsets import TopicPartition
from ister.spark.options import ClientAuth
from ister.spark.rows import to_batch
from ister.spark.shared import shared_client
from ister.spark.values import ValueDecoder, ValueSpec, fetcher
from ister.storage.objects import parquet
from ister.storage.objects.segment import read_segment_runs
from ister.storage.objects.store import open_store

log = logging.getLogger(__name__)
COPY_BATCH_ROWS = 64 * 1024  # rows per Arrow batch handed to Spark from a Parquet copy
T = TypeVar("T")


@dataclass
class OffsetRange(InputPartition):
    """One input partition: records [start, end) of one topic partition, and where to find them."""

    tp: TopicPartition
    start: int
    end: int
    service_url: str
    connect_timeout: float
    include_headers: bool
    max_records: int
    # Objects (first, last, key) overlapping the range when the driver could list them, and the store.
    objects: list[tuple[int, int, str]] = field(default_factory=list)
    storage_url: str | None = None
    storage_options: dict[str, str] = field(default_factory=dict)
    value_spec: ValueSpec | None = None  # valueFormat=schema: decode values by the registry's schemas
    auth: ClientAuth = field(default_factory=ClientAuth)  # its repr hides the token
    # Parquet copies (docs/formats.md) of those objects, by (first, last): read instead when they check out.
    copies: dict[tuple[int, int], str] = field(default_factory=dict)


def _sync(agen: AsyncIterator[T], loop: asyncio.AbstractEventLoop) -> Iterator[T]:
    while True:
        try:
            yield loop.run_until_complete(agen.__anext__())
        except StopAsyncIteration:
            return


def read_range(part: OffsetRange) -> Iterator[pa.RecordBatch]:
    """The range's rows; with valueFormat=schema, values decoded (or handled per `mode`)."""
    if part.value_spec is None:
        yield from read_raw(part)
        return
    decoder = ValueDecoder(part.value_spec, fetcher(part.service_url, part.connect_timeout, part.auth))
    for batch in read_raw(part):
        yield decoder.decode(batch)


def read_raw(part: OffsetRange) -> Iterator[pa.RecordBatch]:
    position = part.start
    if part.objects and part.storage_url:
        loop = asyncio.new_event_loop()
        try:
            store: Any = open_store(part.storage_url, part.storage_options)
            for first, last, key in sorted(part.objects):
                if last < position:
                    continue
                if first > position or position >= part.end:
                    break  # a hole in the objects: the broker's read knows whether offsets exist there
                copy = part.copies.get((first, last))
                table = None if copy is None else _read_copy(store, copy, first, last, loop)
                if table is not None:
                    stop = min(part.end, last + 1)
                    rows = table.slice(position - first, stop - position)
                    if not part.include_headers:
                        rows = rows.drop_columns(["headers"])
                    yield from rows.to_batches(max_chunksize=COPY_BATCH_ROWS)
                    position = stop
                    continue
                for first, payloads in _sync(read_segment_runs(store, key, position, part.end - 1), loop):
                    if any(map(missing_dictionary, payloads)):
                        break  # zstd dictionaries live in the brokers' metadata: the broker reads them
                    count = len(payloads)
                    yield to_batch(part.tp, range(first, first + count), payloads, part.include_headers)
                    position = first + count
                else:
                    position = max(position, last + 1)
                    continue
                break
        finally:
            loop.close()
    if position < part.end:
        client = shared_client(part.service_url, part.connect_timeout, part.auth)
        for records in client.read(part.tp.name, position, part.end, max_records=part.max_records):
            if records:
                offsets = [o for o, _ in records]
                yield to_batch(part.tp, offsets, [r for _, r in records], part.include_headers)


def _read_copy(
    store: Any, key: str, first: int, last: int, loop: asyncio.AbstractEventLoop
) -> pa.Table | None:
    """The rows of a Parquet copy (checked to be exactly first..last), or None when it cannot be used: the
    caller then reads the object itself, so a missing or damaged copy only costs speed."""
    try:
        data = loop.run_until_complete(store.get(key))
        return parquet.read_table(data, first, last).replace_schema_metadata(None)
    except Exception as exc:
        log.warning("Parquet copy %s not used (%s); reading its object", key, exc)
        return None
