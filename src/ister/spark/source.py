"""`spark.read.format("ister")` and `spark.readStream.format("ister")`.

Offsets are `{"/ns/topic": {"<partition>": next offset}}` ("-1" for a topic without partitions). Every
micro-batch is a fixed offset range per partition, read from immutable objects and the WAL, so a replay
after a failure yields the same rows: with Spark's checkpoint this is exactly-once into an idempotent or
transactional sink (Spark's file sink). `commit()` is not used as an acknowledgement: Spark calls it one
batch late, and the checkpoint is the source of truth.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import DataType, StructType

from ister.client.blocking import BlockingClient
from ister.client.client import TopicOffsets
from ister.core import stream_offsets as so
from ister.core.stream_offsets import Positions, Spec, TopicPartition
from ister.errors import DataLoss, InvalidArgument, IsterError, NotFound
from ister.spark import discovery
from ister.spark.offsets import check_spec
from ister.spark.options import SinkOptions, SourceOptions, ValueOptions, include_headers
from ister.spark.ranges import OffsetRange, read_range
from ister.spark.registry import value_spec
from ister.spark.rows import ddl, typed_schema
from ister.spark.values import ValueSpec

log = logging.getLogger(__name__)
# An unchanged cursor is set again after this long: a broker that took the topic over (or restarted)
# learns the named cursor and shows its lag again.
CURSOR_REFRESH_SECONDS = 10.0


class IsterDataSource(DataSource):
    """The `ister` format: batch and streaming reads of reliable topics, batch and streaming writes."""

    @classmethod
    def name(cls) -> str:
        return "ister"

    def schema(self) -> str | StructType:
        value = ValueOptions.parse(self.options)
        if not value.typed:
            return ddl(include_headers(self.options))
        spec, value_type = self._typed(SourceOptions.parse(self.options, streaming=None))
        return typed_schema(include_headers(self.options), value_type, spec.corrupt_column)

    def _typed(self, opts: SourceOptions) -> tuple[ValueSpec, DataType]:
        """The reader's schema version and its Spark type, resolved once per data source (schema() and the
        reader agree; Spark pickles the data source, so the type only, not the conversions)."""
        found: tuple[ValueSpec, DataType] | None = getattr(self, "_value_spec", None)
        if found is None:
            spec, shape = value_spec(opts)
            found = self._value_spec = (spec, shape.dtype)
        return found

    def _with_spec(self, opts: SourceOptions, schema: StructType) -> SourceOptions:
        if not opts.value.typed:
            return opts
        spec, value_type = self._typed(opts)
        value = next((f.dataType for f in schema.fields if f.name == "value"), None)
        if value is None or value.simpleString() != value_type.simpleString():  # nullability aside
            raise InvalidArgument(
                f"subject {spec.subject} changed while the query was planned (version {spec.version} has "
                "another type than the schema Spark was given): run the query again"
            )
        return dataclasses.replace(opts, value_spec=spec)

    def reader(self, schema: StructType) -> DataSourceReader:
        opts = SourceOptions.parse(self.options, streaming=False)
        return IsterBatchReader(self._with_spec(opts, schema))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        try:
            opts = self._with_spec(SourceOptions.parse(self.options, streaming=True), schema)
        except IsterError as exc:
            # Raised here, PySpark's stream runner hides it behind an UnboundLocalError of its own.
            return RefusedStreamReader(exc)
        return IsterStreamReader(opts)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from ister.spark.sink import IsterBatchWriter

        if overwrite:
            raise InvalidArgument("an Ister topic is a log and cannot be overwritten: use mode('append')")
        return IsterBatchWriter(SinkOptions.parse(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from ister.spark.sink import IsterStreamWriter

        if overwrite:
            raise InvalidArgument(
                "an Ister topic is a log and cannot be overwritten: use outputMode('append')"
            )
        return IsterStreamWriter(SinkOptions.parse(self.options), schema)


class _Planner:
    """What batch and stream readers share: partition discovery, offsets, and input partitions."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.described: dict[TopicPartition, TopicOffsets] = {}  # as of the last `describe`
        self._times: Spec | None = None  # startingOffsetsByTimestamp, keys checked
        self._client: BlockingClient | None = None
        self._skipped: set[str] = set()  # topicsPattern: topics already warned about
        self._listed: dict[
            TopicPartition, tuple[list[tuple[int, int, str]], dict[tuple[int, int], str]]
        ] = {}  # per planning round: objects and Parquet copies

    @property
    def client(self) -> BlockingClient:
        """One client (and loop thread) for the reader's life, not one per planning call."""
        if self._client is None:
            auth = self.opts.auth
            self._client = BlockingClient(
                self.opts.service_url,
                connect_timeout=self.opts.connect_timeout,
                token=auth.token,
                tls_ca=auth.tls_ca,
            )
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def describe(self, tps: list[TopicPartition] | None = None) -> dict[TopicPartition, TopicOffsets]:
        """Offsets of the query's partitions (or of `tps`); objects are listed again after this."""
        if tps is None:
            tps = discovery.partitions(self.client, self.opts, self._skipped)
        self._listed = {}
        self.described = discovery.describe(self.client, self.opts, tps, self._skipped)
        return self.described

    def heads(self) -> Positions:
        """Each partition's head as of the last `describe`."""
        out: Positions = {}
        for tp, info in self.described.items():
            so.put(out, tp, info.next)
        return out

    def first_position(self, tp: TopicPartition, start: int, info: TopicOffsets) -> int:
        """Where a new query (or a batch read) starts, from its resolved startingOffsets (or a starting
        time: the first message published at or after it, the head when none is): a start past the head
        is an error, or the head with failOnDataLoss=false (nothing old to read)."""
        when = self.starting_time_of(tp)
        if when is not None:
            return max(info.earliest, min(self.client.offset_for_time(tp.name, when), info.next))
        if start > info.next:
            what = f"{tp.name}: startingOffsets {start} is past the head {info.next}"
            if self.opts.fail_on_data_loss:
                raise DataLoss(f"{what}; set failOnDataLoss=false to start at the head instead")
            log.warning("%s; starting at the head (failOnDataLoss=false)", what)
            return info.next
        return self.check_loss(tp, start, info)

    def starting_time_of(self, tp: TopicPartition) -> int | None:
        opts = self.opts
        if opts.starting_time is not None:
            return opts.starting_time
        if isinstance(opts.starting_times, dict):
            if self._times is None:  # its keys checked against the query's partitions, as startingOffsets
                self._times = check_spec(opts.starting_times, "startingOffsetsByTimestamp", self.described)
            return so.get(self._times, tp) if isinstance(self._times, dict) else None
        return None

    def check_loss(self, tp: TopicPartition, start: int, info: TopicOffsets) -> int:
        """Where reading really starts when the checkpoint is behind retention or past the head."""
        if info.earliest <= start <= info.next:
            return start
        what = (
            f"{tp.name}: offset {start} is no longer available (earliest is {info.earliest})"
            if start < info.earliest
            else f"{tp.name}: offset {start} is past the head {info.next} (was the topic re-created?)"
        )
        if self.opts.fail_on_data_loss:
            raise DataLoss(f"{what}; set failOnDataLoss=false to skip ahead")
        # As Kafka's source: continue at the earliest offset there is (a re-created topic is read anew).
        log.warning("%s; continuing at offset %d (failOnDataLoss=false)", what, info.earliest)
        return info.earliest

    def listing(
        self, tp: TopicPartition
    ) -> tuple[str | None, list[tuple[int, int, str]], dict[tuple[int, int], str]]:
        """(store URL, objects, Parquet copies) of a described partition, listed once per planner."""
        info = self.described.get(tp)
        url = self.opts.storage_url or (info.durable_url if info else None)
        found = self._listed.get(tp)
        if found is None:
            found = (
                discovery.list_objects(url, self.opts.storage_options, info.object_prefix)
                if info
                else ([], {})
            )
            self._listed[tp] = found
        return url, found[0], found[1] if self.opts.use_parquet else {}

    def input_partitions(
        self, ranges: dict[TopicPartition, tuple[int, int]] | list[tuple[TopicPartition, int, int]]
    ) -> list[OffsetRange]:
        """Input partitions of `ranges` (one range per partition, cut by minPartitions and
        maxOffsetsPerPartition; or ranges planned already, cut by maxOffsetsPerPartition only)."""
        if isinstance(ranges, dict):
            planned = so.plan_ranges(ranges, self.opts.min_partitions, self.opts.max_offsets_per_partition)
        else:
            planned = []
            for tp, a, b in ranges:
                planned.extend(so.plan_ranges({tp: (a, b)}, None, self.opts.max_offsets_per_partition))
        out = []
        for tp, start, end in planned:
            url, objects, copies = self.listing(tp)
            overlapping = [o for o in objects if o[1] >= start and o[0] < end]
            out.append(
                OffsetRange(
                    tp=tp,
                    start=start,
                    end=end,
                    service_url=self.opts.service_url,
                    connect_timeout=self.opts.connect_timeout,
                    include_headers=self.opts.include_headers,
                    max_records=self.opts.max_records,
                    objects=overlapping,
                    storage_url=url,
                    storage_options=dict(self.opts.storage_options),
                    value_spec=self.opts.value_spec,
                    auth=self.opts.auth,
                    copies={(a, b): copies[(a, b)] for a, b, _ in overlapping if (a, b) in copies},
                )
            )
        return out


class IsterBatchReader(DataSourceReader):
    def __init__(self, opts: SourceOptions) -> None:
        self.planner = _Planner(opts)

    def partitions(self) -> Sequence[InputPartition]:
        try:
            if self.planner.opts.ranges is not None:
                return self.planner.input_partitions(self.given_ranges())
            return self.planner.input_partitions(self.plan())
        finally:
            self.planner.close()  # planned once: the executors open their own clients

    def plan(self) -> dict[TopicPartition, tuple[int, int]]:
        """[start, end) of every partition of the query, from startingOffsets and endingOffsets and one
        round of Offsets calls."""
        opts = self.planner.opts
        ranges: dict[TopicPartition, tuple[int, int]] = {}
        described = self.planner.describe()
        starting = check_spec(opts.starting, "startingOffsets", described)
        ending = check_spec(opts.ending, "endingOffsets", described)
        for tp, info in described.items():
            start = so.resolve(starting, tp, info.earliest, info.next, missing="earliest")
            end = so.resolve(ending, tp, info.earliest, info.next, missing="latest")
            given_end = None if isinstance(ending, str) else so.get(ending, tp)
            if given_end is not None and 0 <= given_end < start:  # -1 (latest) is not a given end
                raise InvalidArgument(f"{tp.name}: startingOffsets {start} is after endingOffsets {end}")
            start = self.planner.first_position(tp, start, info)
            ranges[tp] = (start, max(start, min(end, info.next)))
        return ranges

    def given_ranges(self) -> list[tuple[TopicPartition, int, int]]:
        """The exact ranges `ister.spark.read` planned (RANGES): only retention running since then can
        change them (failOnDataLoss decides)."""
        given = self.planner.opts.ranges or {}
        described = self.planner.describe(sorted(given))
        out = []
        for tp, spans in sorted(given.items()):
            info = described.get(tp)
            if info is None:
                continue  # a topicsPattern topic deleted since: skipped with a warning
            for a, b in spans:
                start = a if a >= info.earliest else self.planner.check_loss(tp, a, info)
                if start < b:
                    out.append((tp, start, b))
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, OffsetRange):  # Spark reads one empty partition when none was planned
            yield from read_range(partition)


class IsterStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of offset ranges. `latestOffset` takes optional (start, limit) so it runs on Spark
    4.0/4.1 (called without arguments: maxOffsetsPerTrigger applied from the last planned end) and on 4.2+
    (admission control with ReadMaxRows)."""

    def __init__(self, opts: SourceOptions) -> None:
        self.planner = _Planner(opts)
        self._last_end: Positions | None = None  # for the 4.0/4.1 signature
        self._available_now: Positions | None = None
        # Where the named cursor was last moved to, and when (monotonic seconds).
        self._cursor_at: dict[TopicPartition, tuple[int, float]] = {}

    def initialOffset(self) -> Positions:
        opts = self.planner.opts
        out: Positions = {}
        described = self.planner.describe()
        starting = check_spec(opts.starting, "startingOffsets", described)
        for tp, info in described.items():
            start = so.resolve(starting, tp, info.earliest, info.next, missing="earliest")
            so.put(out, tp, self.planner.first_position(tp, start, info))
        self._last_end = out  # the start of the first batch, for the 4.0/4.1 `latestOffset()`
        return out

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.planner.opts.max_offsets_per_trigger
        return ReadMaxRows(n) if n is not None else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.planner.describe()
        self._available_now = self.planner.heads()

    def reportLatestOffset(self) -> Positions:
        """The true heads, as `latestOffset` just fetched them (no second round of Offsets calls)."""
        if not self.planner.described:
            self.planner.describe()
        return self.planner.heads()

    def latestOffset(self, start: Positions | None = None, limit: ReadLimit | None = None) -> Positions:
        if start is not None:
            # Spark plans one batch at a time: the start it passes is where the last committed batch
            # ended, so the named cursor catches up even when no new batch follows (commit() would not).
            self._move_cursor(start)
        self.planner.describe()
        heads = self.planner.heads()
        if self._available_now is not None:  # AvailableNow: nothing that arrived after the query started
            for topic, parts in heads.items():
                for part, head in parts.items():
                    target = self._available_now.get(topic, {}).get(part)
                    parts[part] = head if target is None else min(head, target)
        if start is None:
            start = self._last_end
            if limit is None and self.planner.opts.max_offsets_per_trigger is not None:
                limit = ReadMaxRows(self.planner.opts.max_offsets_per_trigger)
        end = heads
        if start is not None:
            # A partition that the start does not know yet (new partition, new topic) starts at earliest.
            begin: dict[TopicPartition, int] = {}
            for tp, info in self.planner.described.items():
                known = so.get(start, tp)
                # Checked here too: a checkpoint past the head plans no batch, so `partitions` never runs.
                begin[tp] = info.earliest if known is None else self.planner.check_loss(tp, known, info)
            ends = {tp: max(begin[tp], so.get(heads, tp) or 0) for tp in begin}
            if isinstance(limit, ReadMaxRows):
                ends = so.cap(begin, ends, limit.max_rows)
            end = {}
            for tp, offset in ends.items():
                so.put(end, tp, offset)
            for topic, parts in start.items():  # keep positions of partitions that disappeared
                for part, offset in parts.items():
                    end.setdefault(topic, {}).setdefault(part, offset)
        self._last_end = end
        return end

    def partitions(self, start: Positions, end: Positions) -> Sequence[InputPartition]:
        self._last_end = end  # after a restart Spark plans from its checkpoint: follow it
        if not self.planner.described:
            self.planner.describe()
        ranges: dict[TopicPartition, tuple[int, int]] = {}
        for topic, parts in end.items():
            for part, stop in parts.items():
                tp = TopicPartition(topic, int(part))
                info = self.planner.described.get(tp)
                if info is None:
                    try:
                        info = self.planner.client.offsets(tp.name)
                        self.planner.described[tp] = info
                    except NotFound:
                        if self.planner.opts.fail_on_data_loss:
                            raise DataLoss(f"{tp.name} no longer exists") from None
                        continue
                begin = so.get(start, tp)
                begin = info.earliest if begin is None else begin
                begin = self.planner.check_loss(tp, begin, info)
                ranges[tp] = (begin, max(begin, stop))
        return self.planner.input_partitions(ranges)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, OffsetRange):
            yield from read_range(partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Spark's checkpoint holds the position (Spark calls this one batch late); with
        predefinedSubscription the named cursor follows, so the lag shows on the broker."""
        self._move_cursor(end)

    def _move_cursor(self, positions: Positions) -> None:
        """Best effort: a cursor that cannot move is logged, never fails the query (it only shows lag)."""
        sub = self.planner.opts.cursor_subscription
        if sub is None:
            return
        for topic, parts in positions.items():
            for part, offset in parts.items():
                tp = TopicPartition(topic, int(part))
                last = self._cursor_at.get(tp)
                now = time.monotonic()
                if last is not None and last[0] == offset and now - last[1] < CURSOR_REFRESH_SECONDS:
                    continue
                try:
                    self.planner.client.set_cursor(tp.name, sub, int(offset))
                except IsterError as exc:
                    log.warning("named cursor %r of %s not moved to %d: %s", sub, tp.name, offset, exc)
                    continue
                self._cursor_at[tp] = (offset, now)

    def stop(self) -> None:
        self.planner.close()


class RefusedStreamReader(DataSourceStreamReader):
    """A stream reader whose options were refused: every call raises that error (PySpark's runner cannot
    report an error raised while the reader is made)."""

    def __init__(self, error: IsterError) -> None:
        self.error = error

    def initialOffset(self) -> Positions:
        raise self.error

    def latestOffset(self, start: Positions | None = None, limit: ReadLimit | None = None) -> Positions:
        raise self.error

    def partitions(self, start: Positions, end: Positions) -> Sequence[InputPartition]:
        raise self.error

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        raise self.error

    def commit(self, end: dict[str, Any]) -> None:
        raise self.error

    def stop(self) -> None:
        """Nothing was opened."""
