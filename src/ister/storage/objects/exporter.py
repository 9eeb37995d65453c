"""Export closed WAL segment files to durable objects and record their descriptors.

Order per object: upload the object, then write its descriptor, then advance `cur`. A crash in between
leaves at most an object nobody references (overwritten by the same key on the next pass); never a
descriptor without its object. Files (or parts of files) whose offsets have no descriptor yet are exported
by the next pass; offsets that already have a descriptor are never exported again (no second descriptor
for a range, even if a file was exported earlier while it was shorter).

Offsets the WAL lost or found damaged (`Wal.holes()`) are never exported (there is nothing valid to
export): they are planned around like covered ranges. A file whose export meets a bad frame the WAL did not
know about yet is checked frame by frame (`Wal.verify_segment`, which records the damaged ranges) and
planned again, so one damaged frame never stops the export of the rest.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import Counter

from ister.core.backoff import Backoff
from ister.core.frames import INDEX_EVERY_BYTES, INDEX_EVERY_FRAMES, scan_frames
from ister.core.stream_offsets import TopicPartition
from ister.errors import CorruptionError, FailedPrecondition, IsterError
from ister.ids import TopicName
from ister.limits import MiB
from ister.metadata.keys import TopicLike
from ister.metadata.store import MetadataStore
from ister.storage.wal import Wal

from . import catalog
from .catalog import DEFAULT_METADATA_TIMEOUT, ObjectDescriptor
from .retention import LocalRetention, deletable, file_ages
from .segment import SegmentBuilder, object_key, object_name, topic_object_prefix
from .store import ObjectStore, PutInfo

log = logging.getLogger(__name__)

parquet_copies = Counter(
    "ister_parquet_copies",
    "Parquet copies of exported objects (storage.durable.parquet): written, or failed (the object is used)",
    ("result",),
)

FILE_CHUNK = 4 * MiB  # bytes read from a WAL file at a time
FEED_SLICE = 128 * 1024  # frames checked between pauses (~1,000 of 100 bytes: about 1 ms of Python)
FEED_PAUSE_S = 0.001


@dataclass(frozen=True, slots=True)
class Piece:
    """Frames first..last of a WAL file, at byte positions [start_pos, end_pos)."""

    first: int
    last: int
    start_pos: int
    end_pos: int


def _covered_until(covered: Sequence[tuple[int, int]], offset: int) -> tuple[bool, int | None]:
    """(is `offset` covered, the offset where that changes or None). `covered` is sorted, disjoint."""
    for start, end in covered:
        if end < offset:
            continue
        if start <= offset:
            return True, end + 1
        return False, start
    return False, None


def plan_file(
    path: Path, first: int, size: int, covered: Sequence[tuple[int, int]], last: int | None = None
) -> list[Piece]:
    """Split a WAL file's frames into the runs not in `covered` (blocking; headers only, chunked reads).

    `size` is the WAL's valid size of the file: the frames must end exactly there (else CorruptionError).
    `last`, when given, is the highest offset the file can hold: a covered run that reaches it ends the
    plan without reading the rest of the file (it may be a damaged range the WAL knows of).
    """
    pieces: list[Piece] = []
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        buf = b""  # unscanned bytes from buf_pos on
        buf_pos = 0

        def fill(min_len: int) -> None:
            nonlocal buf
            have_end = buf_pos + len(buf)
            want = min(max(min_len - len(buf), FILE_CHUNK), size - have_end)
            if want > 0:
                data = os.pread(fd, want, have_end)
                if len(data) != want:
                    raise CorruptionError(f"WAL file {path} is shorter than {size} bytes")
                buf += data

        expect = first
        region_first, region_pos = first, 0
        in_covered, bound = _covered_until(covered, first)
        while True:
            if buf_pos == size or (bound is not None and expect == bound):
                if not in_covered and expect > region_first:
                    pieces.append(Piece(region_first, expect - 1, region_pos, buf_pos))
                if buf_pos == size:
                    break
                region_first, region_pos = expect, buf_pos
                in_covered, bound = _covered_until(covered, expect)
                if in_covered and last is not None and bound is not None and bound > last:
                    break  # covered to the end of the file
                continue
            if len(buf) < FILE_CHUNK:
                fill(0)
            limit = None if bound is None else bound - expect
            res = scan_frames(buf, buf_pos, expect, verify_crc=False, collect=False, max_frames=limit)
            if res.stop in ("crc", "gap", "too_large"):
                raise CorruptionError(f"WAL file {path}: {res.stop} at byte {res.end_pos}")
            if res.count == 0:  # "torn": the next frame is not complete in buf
                if buf_pos + len(buf) >= size:
                    raise CorruptionError(f"WAL file {path}: incomplete frame at byte {buf_pos}")
                fill(res.needed)
                continue
            assert res.next_offset is not None
            expect = res.next_offset
            buf = buf[res.safe_length :]
            buf_pos = res.end_pos
    finally:
        os.close(fd)
    return pieces


def _feed_gently(builder: SegmentBuilder, data: bytes) -> bytes:
    """`builder.feed(data)` in slices with a pause after each: the per-frame checks are Python and hold the
    GIL, so the event loop (publishes, deliveries) gets the interpreter to itself between slices."""
    out: list[bytes] = []
    view = memoryview(data)
    for at in range(0, len(data), FEED_SLICE):
        out.append(builder.feed(view[at : at + FEED_SLICE]))
        time.sleep(FEED_PAUSE_S)
    return b"".join(out)


def _spans_overlap(spans: Sequence[tuple[int, int]], first: int, last: int) -> bool:
    return any(start <= last and end >= first for start, end in spans)


def _pread(path: Path, position: int, length: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.pread(fd, length, position)
    finally:
        os.close(fd)
    if len(data) != length:
        raise CorruptionError(f"WAL file {path}: short read at byte {position}")
    return data


def _intervals(
    descriptors: Sequence[ObjectDescriptor], holes: Sequence[tuple[int, int]] = ()
) -> list[tuple[int, int]]:
    """Inclusive (first, last) ranges of the descriptors and of the WAL's holes ((first, end) with end
    exclusive), sorted and merged into disjoint ranges."""
    spans = sorted([(d.start_offset, d.end_offset) for d in descriptors] + [(a, b - 1) for a, b in holes])
    merged: list[tuple[int, int]] = []
    for a, b in spans:
        if merged and a <= merged[-1][1] + 1:
            if b > merged[-1][1]:
                merged[-1] = (merged[-1][0], b)
        else:
            merged.append((a, b))
    return merged


def _spans_cover(spans: Sequence[tuple[int, int]], lo: int, hi: int) -> bool:
    """True if the merged inclusive `spans` hold every offset of [lo, hi]."""
    return any(a <= lo and hi <= b for a, b in spans)


class SegmentExporter:
    """Exports one topic's WAL files to objects. One instance per topic; its methods never run at once.

    The broker calls `run(interval)` as a background task while it owns the topic (it only reads closed
    files, so producers are never slowed), and `export_tail()` after `await wal.close()` when sealing.
    """

    def __init__(
        self,
        topic: TopicLike,
        wal: Wal,
        object_store: ObjectStore,
        metadata_store: MetadataStore,
        *,
        key_prefix: str | None = None,
        metadata_timeout: float = DEFAULT_METADATA_TIMEOUT,
        index_every_frames: int = INDEX_EVERY_FRAMES,
        index_every_bytes: int = INDEX_EVERY_BYTES,
        clock: Callable[[], float] = time.time,
        parquet: bool = False,
    ) -> None:
        self.topic = topic if isinstance(topic, TopicName) else TopicName.parse(topic)
        self.wal = wal
        self.objects = object_store
        self.metadata = metadata_store
        self.key_prefix = (
            key_prefix
            if key_prefix is not None
            else topic_object_prefix(self.topic.namespace, self.topic.topic)
        )
        self.metadata_timeout = metadata_timeout
        self.index_every_frames = index_every_frames
        self.index_every_bytes = index_every_bytes
        self._clock = clock
        # Also write each object's records as a Parquet copy (docs/formats.md, "Parquet copies"), for
        # Spark's own Parquet reader. Best effort: a failure is counted and logged, never fails the export.
        self.parquet = parquet
        self.parquet_written = 0
        self.parquet_failures = 0
        self._lock = asyncio.Lock()
        self._done: dict[Path, int] = {}  # files found fully exported: path -> size then
        self._wakeup: asyncio.Event | None = None  # made by run() (an Event costs ~700 bytes per topic)
        # health, for metrics and logs
        self.descriptors: list[ObjectDescriptor] = []  # as of the last pass
        self.last_error: BaseException | None = None
        self.failures = 0  # consecutive failed passes
        self.last_success: float | None = None

    # ---- passes ----------------------------------------------------------------------------------

    async def export_closed(self) -> list[ObjectDescriptor]:
        """One pass over the closed (rotated) files; returns the descriptors recorded by this pass."""
        async with self._lock:
            return await self._export(include_active=False)

    async def export_tail(self) -> list[ObjectDescriptor]:
        """Seal: export everything not exported yet, the last (active) file included. Call it only after
        `await wal.close()`; raises FailedPrecondition while the WAL is open."""
        if not self.wal.closed:
            raise FailedPrecondition("export_tail needs a closed WAL (await wal.close() first)")
        async with self._lock:
            return await self._export(include_active=True)

    def trigger(self) -> None:
        """Ask `run` for a pass now (after a rotation, say) instead of at the next interval."""
        if self._wakeup is not None:
            self._wakeup.set()

    async def run(self, interval: float, *, initial_backoff: float = 1.0, max_backoff: float = 60.0) -> None:
        """Export every `interval` seconds until cancelled. A failed pass is retried after a capped
        exponential backoff (with jitter); the loop never ends on an error."""
        if interval <= 0 or initial_backoff <= 0 or max_backoff < initial_backoff:
            raise ValueError("interval and backoffs must be positive, max_backoff >= initial_backoff")
        backoff = Backoff(first=initial_backoff, cap=max_backoff, jitter=0.25)
        if self._wakeup is None:
            self._wakeup = asyncio.Event()
        wakeup = self._wakeup
        while True:
            try:
                await self.export_closed()
                delay = interval
            except Exception as exc:  # never let the loop die: log, back off, retry
                delay = backoff.delay(self.failures, random.random())
                retriable = isinstance(exc, IsterError) and exc.retriable
                log.log(
                    logging.WARNING if retriable else logging.ERROR,
                    "export of %s failed (%d in a row, retry in %.1f s): %s",
                    self.topic.full,
                    self.failures,
                    delay,
                    exc,
                    exc_info=not isinstance(exc, IsterError),
                )
            wakeup.clear()
            if self.failures:
                await asyncio.sleep(delay)
            else:
                try:
                    async with asyncio.timeout(delay):
                        await wakeup.wait()
                except TimeoutError:
                    pass

    # ---- retention -------------------------------------------------------------------------------

    async def deletable(self, retention: LocalRetention, *, keep_from: int | None = None) -> list[Path]:
        """WAL files the broker may delete now: see `retention.deletable` (uses fresh descriptors)."""
        descriptors = await catalog.list_descriptors(self.metadata, self.topic, timeout=self.metadata_timeout)
        segments = self.wal.segments()
        ages = None
        if retention.keep_seconds > 0:
            ages = await asyncio.to_thread(file_ages, [p for _, p, _ in segments], self._clock())
        return deletable(
            segments, descriptors, retention, ages=ages, keep_from=keep_from, holes=self.wal.holes()
        )

    # ---- internals -------------------------------------------------------------------------------

    async def _export(self, include_active: bool) -> list[ObjectDescriptor]:
        try:
            recorded = await self._export_pass(include_active)
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError):
                self.failures += 1
                self.last_error = exc
            raise
        self.failures = 0
        self.last_error = None
        self.last_success = self._clock()
        return recorded

    async def _export_pass(self, include_active: bool) -> list[ObjectDescriptor]:
        descriptors = await catalog.list_descriptors(self.metadata, self.topic, timeout=self.metadata_timeout)
        segments = self.wal.segments()
        candidates = segments if include_active else segments[:-1]
        recorded: list[ObjectDescriptor] = []
        spans = _intervals(descriptors, self.wal.holes())
        for i, (first, path, size) in enumerate(candidates):
            if size == 0 or self._done.get(path) == size:
                continue
            # the file's last offset is at most this (exact for the active file of a closed WAL)
            bound = segments[i + 1][0] - 1 if i + 1 < len(segments) else self.wal.next_offset - 1
            if self.wal.visible_cap is not None and bound >= self.wal.committed_offset:
                break  # a replicated leader exports only what replicas hold: never a suffix cut later
            if bound >= first and _spans_cover(spans, first, bound):
                self._done[path] = size
                continue
            try:
                try:
                    # A closed file's frames run exactly to the next file's first offset (or a known hole).
                    exact = i + 1 < len(segments)
                    await self._export_file(path, first, size, bound, descriptors, recorded, exact)
                except CorruptionError:
                    # A bad frame the WAL did not know about: find and record every damaged range of the
                    # file, then export what is left around them (re-raised if nothing new was found).
                    if not await self.wal.verify_segment(first):
                        raise
                    await self._export_file(path, first, size, bound, descriptors, recorded)
            except FileNotFoundError:
                log.warning("WAL file %s vanished before export (deleted by retention?)", path)
                continue
            self._done[path] = size
            spans = _intervals(descriptors, self.wal.holes())
        if descriptors:
            # A crash between a descriptor and `cur` is repaired here (cur never moves backwards).
            await catalog.advance_cur(
                self.metadata, self.topic, descriptors[-1].start_offset, timeout=self.metadata_timeout
            )
        self.descriptors = descriptors
        return recorded

    async def _export_file(
        self,
        path: Path,
        first: int,
        size: int,
        last: int,
        descriptors: list[ObjectDescriptor],
        recorded: list[ObjectDescriptor],
        exact: bool = False,
    ) -> None:
        covered_spans = _intervals(descriptors, self.wal.holes())
        if exact and not _spans_overlap(covered_spans, first, last):
            # Nothing of it exported or lost: one piece, no planning pass over every header (the object
            # builder checks every frame, and a file that does not hold exactly first..last fails there).
            pieces = [Piece(first, last, 0, size)]
        else:
            pieces = await asyncio.to_thread(plan_file, path, first, size, covered_spans, last)
        for piece in pieces:
            desc = await self._export_piece(path, piece, descriptors)
            descriptors.append(desc)
            descriptors.sort(key=lambda d: d.start_offset)
            recorded.append(desc)

    async def _export_piece(
        self, path: Path, piece: Piece, descriptors: list[ObjectDescriptor]
    ) -> ObjectDescriptor:
        key = object_key(self.key_prefix, piece.first, piece.last)
        builder = SegmentBuilder(
            piece.first,
            index_every_frames=self.index_every_frames,
            index_every_bytes=self.index_every_bytes,
            where=f"WAL file {path}",
        )
        body_size = piece.end_pos - piece.start_pos
        tail = b""

        def finish() -> bytes:
            if builder.next_offset != piece.last + 1:
                raise CorruptionError(
                    f"WAL file {path} changed during export: frames end at {builder.next_offset - 1}, "
                    f"expected {piece.last}"
                )
            return builder.finish()

        info: PutInfo
        body: bytes | None = None
        # Reading and checking the frames (every header and CRC, in Python) runs in a worker thread: on the
        # event loop a 4 MiB chunk held it for ~100 ms, which every publish and delivery waited out.
        if body_size <= self.objects.multipart_threshold:

            def build_small() -> tuple[bytes, bytes, bytes]:
                data = _pread(path, piece.start_pos, body_size)
                return data, _feed_gently(builder, data), finish()

            body, head, tail = await asyncio.to_thread(build_small)
            info = await self.objects.put(key, head + tail)
        else:

            def feed(at: int) -> bytes:
                return _feed_gently(builder, _pread(path, at, min(FILE_CHUNK, piece.end_pos - at)))

            async def chunks() -> AsyncIterator[bytes]:
                nonlocal tail
                for at in range(piece.start_pos, piece.end_pos, FILE_CHUNK):
                    out = await asyncio.to_thread(feed, at)
                    if out:
                        yield out
                tail = await asyncio.to_thread(finish)
                yield tail

            info = await self.objects.put_stream(key, chunks(), body_size)
        size = builder.size + len(tail)
        desc = ObjectDescriptor(
            object_name(piece.first, piece.last),
            key,
            piece.first,
            piece.last,
            size,
            info.etag,
            int(self._clock()),
            offset_index=catalog.thin_index(builder.index),
            min_publish_time_ms=builder.time_span[0] if builder.time_span is not None else None,
            max_publish_time_ms=builder.time_span[1] if builder.time_span is not None else None,
        )
        await catalog.record(
            self.metadata, self.topic, desc, existing=descriptors, timeout=self.metadata_timeout
        )
        log.info(
            "exported %s offsets %d..%d to %s (%d bytes)", self.topic.full, piece.first, piece.last, key, size
        )
        if self.parquet:
            # After the descriptor: the copy never delays the object's record (nor the WAL's retention).
            await self._write_parquet(path, piece, key, body)
        return desc

    async def _write_parquet(self, path: Path, piece: Piece, key: str, body: bytes | None) -> None:
        """Write the Parquet copy of an exported piece; any failure is logged and counted, never raised
        (readers then use the object itself)."""
        try:
            from . import parquet  # pyarrow: only brokers that turn the copies on need it

            tp = TopicPartition.of(self.topic.full)
            encoder = parquet.ParquetEncoder(tp.topic, tp.partition, piece.first, piece.last)

            def build() -> bytes:
                if body is not None:
                    encoder.feed(body)
                else:  # a large piece: read it again in chunks rather than keep it in memory
                    for at in range(piece.start_pos, piece.end_pos, FILE_CHUNK):
                        encoder.feed(_pread(path, at, min(FILE_CHUNK, piece.end_pos - at)))
                return encoder.finish()

            data = await asyncio.to_thread(build)
            pkey = parquet.parquet_key(key)
            await self.objects.put(pkey, data)
        except asyncio.CancelledError:
            raise
        except ImportError as exc:
            self.parquet = False  # said once, not per object
            self.parquet_failures += 1
            parquet_copies.labels("failed").inc()
            log.error("Parquet copies are on but cannot be written (%s): install pyarrow; turned off", exc)
            return
        except Exception as exc:
            self.parquet_failures += 1
            parquet_copies.labels("failed").inc()
            log.warning(
                "Parquet copy of %s offsets %d..%d not written (%s); readers use the object",
                self.topic.full,
                piece.first,
                piece.last,
                exc,
                exc_info=not isinstance(exc, IsterError),
            )
            return
        self.parquet_written += 1
        parquet_copies.labels("written").inc()
        log.debug("wrote %s (%d bytes)", pkey, len(data))


__all__ = ["LocalRetention", "Piece", "SegmentExporter", "deletable", "plan_file"]
