"""Segment files: naming, listing, chunked scanning and crash recovery (blocking; run in a thread).

A segment is `<dir>/<first_offset:020d>.wal` holding frames first_offset, first_offset+1, ... back to back.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ister.core.frames import (
    HEADER_SIZE,
    MAX_FRAME_PAYLOAD,
    SparseIndex,
    StopReason,
    payload_crc,
    scan_frames,
)
from ister.errors import CorruptionError, StorageError
from ister.limits import MiB

from .checkpoint import Checkpoint, read_checkpoint, write_checkpoint
from .durable import fsync_dir
from .holes import Hole
from .locks import claim_directory
from .names import list_segment_files, segment_name
from .truncate import finish_pending_cut

log = logging.getLogger(__name__)

SCAN_CHUNK = 4 * MiB


@dataclass(eq=False)
class Segment:
    """In-memory state of one segment file.

    `size` and `end_offset` of the active segment are advanced by the writer thread after each write;
    readers bound their reads by the WAL's committed offset, never by these alone.
    """

    first_offset: int
    path: Path
    size: int = 0  # bytes of valid frames
    end_offset: int = 0  # offset after the last frame (== first_offset when empty)
    index: SparseIndex = field(default_factory=SparseIndex)

    @property
    def frame_count(self) -> int:
        return self.end_offset - self.first_offset


@dataclass(slots=True)
class FileScan:
    end_offset: int  # offset after the last valid frame
    valid_size: int  # byte position after the last valid frame
    file_size: int
    stop: StopReason  # "end" when the whole file is valid frames
    count: int


def scan_segment_file(
    path: Path, first_offset: int, *, verify_crc: bool, index: SparseIndex | None
) -> FileScan:
    """Validate a segment file in bounded chunks (never the whole file in memory)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        file_size = os.fstat(fd).st_size
        buf = b""
        buf_pos = 0  # file position of buf[0]
        expect = first_offset
        count = 0
        want = SCAN_CHUNK
        while True:
            read_at = buf_pos + len(buf)
            data = os.pread(fd, max(want, SCAN_CHUNK), read_at) if read_at < file_size else b""
            at_eof = read_at + len(data) >= file_size
            buf = buf + data if buf else data
            res = scan_frames(buf, buf_pos, expect, verify_crc=verify_crc, collect=False, index=index)
            count += res.count
            if res.next_offset is not None:
                expect = res.next_offset
            if res.stop in ("torn", "end") and not at_eof and data:
                buf = buf[res.safe_length :]
                buf_pos = res.end_pos
                want = res.needed
                continue
            stop: StopReason = res.stop
            return FileScan(
                end_offset=expect, valid_size=res.end_pos, file_size=file_size, stop=stop, count=count
            )
    finally:
        os.close(fd)


def _is_valid_frame_at(path: Path, pos: int) -> bool:
    """True if a complete frame with a matching CRC and a non-empty payload starts at `pos`."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        head = os.pread(fd, HEADER_SIZE, pos)
        if len(head) < HEADER_SIZE:
            return False
        length = int.from_bytes(head[8:12], "little")
        crc = int.from_bytes(head[12:16], "little")
        if length == 0 or length > MAX_FRAME_PAYLOAD:
            return False
        payload = os.pread(fd, length, pos + HEADER_SIZE)
        return len(payload) == length and payload_crc(payload) == crc
    finally:
        os.close(fd)


@dataclass(slots=True)
class Recovered:
    segments: list[Segment]  # all segments, by first offset; the last one is the active segment
    next_offset: int
    first_offset: int  # first offset of the run of segments (bridged by holes) that ends at the active one
    truncated: list[tuple[Path, int, int]]  # (path, old size, new size)
    holes: list[Hole] = field(default_factory=list)  # lost and damaged ranges, by first offset
    mark: int | None = None  # the high-water checkpoint read at open (None: none, or unreadable)
    new_lost: bool = False  # recovery recorded a lost range: write the checkpoint before appending
    release: Callable[[], None] = lambda: None  # gives the directory back (see locks.py)


def _new_index(every_frames: int, every_bytes: int) -> SparseIndex:
    return SparseIndex(every_frames, every_bytes)


def recover(
    directory: Path,
    start_offset: int,
    *,
    index_every_frames: int,
    index_every_bytes: int,
    lock_root: Path | None = None,
) -> Recovered:
    """Claim (locks.py: `lock_root` is the cross-process lock, the directory itself by default), scan,
    repair and index the segment files of `directory`; leave an active segment named next_offset (or
    ending exactly at next_offset) ready for appends."""
    directory.mkdir(parents=True, exist_ok=True)
    fsync_dir(directory.parent)
    release = claim_directory(directory, lock_root)
    try:
        try:
            finish_pending_cut(directory)  # a truncation a crash interrupted: the log reopens cut
        except OSError as exc:
            raise StorageError(f"WAL {directory}: cannot finish an interrupted truncation: {exc}") from exc
        recovered = _recover(directory, start_offset, index_every_frames, index_every_bytes)
    except BaseException:
        release()
        raise
    recovered.release = release
    if recovered.new_lost or recovered.next_offset > (recovered.mark or 0):
        # Before any append: the next open must not start below this, and must know the holes. (The
        # active segment's name already keeps the offset; if this fails, the writer retries.)
        lost = tuple((h.first, h.end) for h in recovered.holes if h.lost)
        try:
            write_checkpoint(directory, Checkpoint(recovered.next_offset, lost))
            recovered.mark = recovered.next_offset
        except OSError as exc:
            log.error("WAL %s: cannot write the high-water checkpoint at open: %s", directory, exc)
            recovered.mark = -1  # the writer writes it as soon as it can
    return recovered


def _recover(
    directory: Path, start_offset: int, index_every_frames: int, index_every_bytes: int
) -> Recovered:
    files = list_segment_files(directory)
    mark, recorded = _read_mark(directory)
    segments: list[Segment] = []
    truncated: list[tuple[Path, int, int]] = []
    holes: list[Hole] = []
    resume = 0  # the next offset must be at least this (a damaged last segment's byte bound)
    prev: Segment | None = None
    for i, (first, path) in enumerate(files):
        last = i == len(files) - 1
        index = _new_index(index_every_frames, index_every_bytes)
        scan = scan_segment_file(path, first, verify_crc=last, index=index)
        if scan.stop != "end":
            next_first = None if last else files[i + 1][0]
            bound = _on_damaged_scan(path, scan, next_first, mark, holes, truncated)
            if bound is not None:
                resume = bound
        seg = Segment(first, path, size=scan.valid_size, end_offset=scan.end_offset, index=index)
        if prev is not None and first < prev.end_offset:
            raise CorruptionError(
                f"WAL segments overlap: {prev.path} ends at offset {prev.end_offset - 1}, "
                f"{path} starts at {first}"
            )
        segments.append(seg)
        prev = seg

    stored = [(s.first_offset, s.end_offset) for s in segments]
    if segments:
        base = segments[0].first_offset
        for a, b in recorded:  # lost ranges of earlier opens, minus what the files hold again
            for lo, hi in _subtract(max(a, base), b, stored):
                holes.append(Hole(lo, hi, True, "recorded as lost in the high-water checkpoint"))
    last_end = segments[-1].end_offset if segments else None
    floor = max(start_offset, mark or 0, resume)
    next_offset = max(last_end, floor) if last_end is not None else floor
    lost_below_mark = _check_against_mark(directory, start_offset, last_end, mark, next_offset, holes)
    new_lost = resume > 0 or lost_below_mark
    holes.sort(key=lambda h: h.first)

    active = segments[-1] if segments else None
    if active is None or active.end_offset != next_offset:
        if active is not None and active.size == 0 and active.path.stat().st_size == 0:
            # An empty last segment (crash right after a rotation, or a persisted start offset): rename it.
            new_path = directory / segment_name(next_offset)
            os.rename(active.path, new_path)
            segments[-1] = Segment(
                next_offset, new_path, 0, next_offset, _new_index(index_every_frames, index_every_bytes)
            )
        else:
            # No segment yet, or the next offset jumps past the last frame: a new empty segment records it.
            new_path = directory / segment_name(next_offset)
            fd = os.open(new_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            os.close(fd)
            segments.append(
                Segment(
                    next_offset, new_path, 0, next_offset, _new_index(index_every_frames, index_every_bytes)
                )
            )
        fsync_dir(directory)

    spans = [(h.first, h.end) for h in holes]
    head = len(segments) - 1
    while head > 0:
        gap = (segments[head - 1].end_offset, segments[head].first_offset)
        if gap[0] != gap[1] and _subtract(gap[0], gap[1], spans):
            if gap[0] < gap[1]:
                log.warning(
                    "WAL offsets %d..%d are not stored locally (gap before %s)",
                    gap[0],
                    gap[1] - 1,
                    segments[head].path,
                )
            break
        head -= 1
    first_offset = segments[head].first_offset
    holes = [h for h in holes if h.end > first_offset]
    return Recovered(segments, next_offset, first_offset, truncated, holes, mark, new_lost)


def _check_against_mark(
    directory: Path,
    start_offset: int,
    last_end: int | None,
    mark: int | None,
    next_offset: int,
    holes: list[Hole],
) -> bool:
    """Compare where the segments end with the high-water mark. Segments ending below it: every offset in
    between that no hole covers yet is lost (recorded as a hole, logged). No segment at all under a mark:
    logged. Whether a new lost range was recorded."""
    lost = False
    if last_end is not None and mark is not None and mark > last_end:
        known = [(h.first, h.end) for h in holes]
        for lo, hi in _subtract(last_end, mark, known):
            log.error(
                "WAL %s ends at offset %d, below its acknowledged high-water mark %d: offsets %d..%d are "
                "lost (a lost or damaged write); they are never handed out again",
                directory,
                last_end,
                mark,
                lo,
                hi - 1,
            )
            holes.append(Hole(lo, hi, True, "segments end below the high-water mark"))
            lost = True
    elif last_end is None and mark is not None and mark > start_offset:
        log.error(
            "WAL %s has no segment file but its high-water mark is %d: offsets below it are not stored "
            "locally; new offsets start at %d",
            directory,
            mark,
            next_offset,
        )
    return lost


def _on_damaged_scan(
    path: Path,
    scan: FileScan,
    next_first: int | None,
    mark: int | None,
    holes: list[Hole],
    truncated: list[tuple[Path, int, int]],
) -> int | None:
    """A segment file whose scan stopped before its end: record the unreadable range as a hole (a file
    before the last, up to the next file's first offset; a last file damaged below the high-water mark),
    or truncate a torn tail of the last file. Returns the offset new appends must start at when the
    damage bounds it (a damaged last file), else None. `next_first` is None for the last file."""
    where = f"{path} at byte {scan.valid_size} (offset {scan.end_offset})"
    if next_first is not None:
        bound = next_first
        if bound > scan.end_offset:
            log.error(
                "WAL segment damaged (%s): %s; offsets %d..%d cannot be read from it",
                scan.stop,
                where,
                scan.end_offset,
                bound - 1,
            )
            why = f"{scan.stop} in {path.name} at byte {scan.valid_size}"
            holes.append(Hole(scan.end_offset, bound, False, why))
    elif (mark is not None and scan.end_offset < mark) or (
        scan.stop == "gap" and _is_valid_frame_at(path, scan.valid_size)
    ):
        # Not a torn tail: acknowledged frames (below the high-water mark), or a checksum-valid frame
        # with a wrong offset, are damaged. Keep the file as it is, start a new one past any frame it
        # can still hold whole (each takes at least HEADER_SIZE bytes), and record the range as lost.
        tail = scan.file_size - scan.valid_size
        resume = max(mark or 0, scan.end_offset + tail // HEADER_SIZE)
        log.error(
            "WAL segment damaged below its acknowledged high-water mark (%s): %s; offsets %d..%d are "
            "lost locally (%d bytes left unread in the file); new offsets start at %d",
            scan.stop,
            where,
            scan.end_offset,
            resume - 1,
            tail,
            resume,
        )
        why = f"{scan.stop} in {path.name} at byte {scan.valid_size}"
        holes.append(Hole(scan.end_offset, resume, True, why))
        return resume
    else:
        if _zeros_after(path, scan.valid_size):
            # the writer's preallocated space, left by a crash (prealloc.py): nothing torn
            log.info("cutting the preallocated space of %s at byte %d", path, scan.valid_size)
        else:
            log.warning(
                "truncating torn WAL tail (%s): %s, %d -> %d bytes",
                scan.stop,
                path,
                scan.file_size,
                scan.valid_size,
            )
        _truncate(path, scan.valid_size)
        truncated.append((path, scan.file_size, scan.valid_size))
    return None


def _read_mark(directory: Path) -> tuple[int | None, tuple[tuple[int, int], ...]]:
    try:
        ckpt = read_checkpoint(directory)
    except (ValueError, OSError) as exc:
        log.error("WAL %s: high-water checkpoint unreadable (%s); recovering without it", directory, exc)
        return None, ()
    if ckpt is None:
        return None, ()
    return ckpt.next_offset, ckpt.lost


def _subtract(first: int, end: int, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of [first, end) outside every (a, b) span (spans sorted by a)."""
    out: list[tuple[int, int]] = []
    at = first
    for a, b in spans:
        if b <= at or a >= end:
            continue
        if a > at:
            out.append((at, a))
        at = max(at, b)
    if at < end:
        out.append((at, end))
    return out


def _zeros_after(path: Path, pos: int) -> bool:
    """True when every byte of the file from `pos` on is zero (read in bounded chunks)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        while chunk := os.pread(fd, SCAN_CHUNK, pos):
            if chunk.count(0) != len(chunk):
                return False
            pos += len(chunk)
        return True
    finally:
        os.close(fd)


def _truncate(path: Path, size: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)
