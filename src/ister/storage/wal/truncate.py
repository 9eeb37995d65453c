"""Cutting a WAL's suffix (`Wal.truncate`) or all of it (`Wal.reset`) on disk, crash-safely (blocking).

A follower replica cuts records the leader never committed; recovery must then neither bring them back
nor, because the high-water checkpoint still names the old end, report their offsets as lost (a lost
range is never handed out again, but the leader's records must go exactly there). So a cut is a small
transaction rolled forward by the next open:

1. the intent `truncate.pending` (the new end, and whether everything goes) is written durably;
2. the checkpoint is lowered to the new end (lost ranges at or above it dropped);
3. the segment files after the one holding the new end are deleted, newest first;
4. that segment is cut at the frame boundary of the new end and fsync'd (or, when the end lies past its
   readable frames, or on a reset, a new empty segment named after the end is created);
5. the directory is fsync'd, then the intent removed (and the directory fsync'd again).

A crash before the intent is durable leaves the old log; after it, `Wal.open` finds the intent and does
steps 2..5 again (each is idempotent), so the log reopens truncated. Without the intent (an unreadable
one is logged and ignored) every intermediate state is still a prefix of the old log that reaches at least
the new end, under a checkpoint no higher than it: never a lost range over the cut offsets.

Intent layout, little-endian: magic `ISTRCUT1` (8 bytes), end u64, flags u32 (bit 0: reset), CRC-32C u32
of the 20 bytes before it.
"""

from __future__ import annotations

import logging
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from crc32c import crc32c

from ister.core.frames import HEADER, HEADER_SIZE, MAX_FRAME_PAYLOAD
from ister.limits import MiB

from .checkpoint import Checkpoint, read_checkpoint, write_checkpoint
from .durable import fsync_dir, remove_file, replace_file
from .names import list_segment_files, segment_name

log = logging.getLogger(__name__)

INTENT_NAME = "truncate.pending"
INTENT_MAGIC = b"ISTRCUT1"
_INTENT = struct.Struct("<8sQI")
_CRC = struct.Struct("<I")
_RESET = 1
WALK_CHUNK = 1 * MiB


@dataclass(frozen=True, slots=True)
class CutPlan:
    end: int  # the log's next offset afterwards
    reset: bool  # every record goes (the log restarts empty at `end`)
    drop: list[Path]  # segment files to delete, oldest first
    holder: Path | None  # the segment cut at `position`; None: a new empty segment named `end` is made
    position: int
    lost: tuple[tuple[int, int], ...]  # lost ranges the lowered checkpoint keeps (all below `end`)


def encode_intent(end: int, reset: bool) -> bytes:
    body = _INTENT.pack(INTENT_MAGIC, end, _RESET if reset else 0)
    return body + _CRC.pack(crc32c(body))


def decode_intent(data: bytes) -> tuple[int, bool]:
    """(end, reset). Raises ValueError naming what is wrong."""
    if len(data) != _INTENT.size + _CRC.size:
        raise ValueError(f"{len(data)} bytes, expected {_INTENT.size + _CRC.size}")
    magic, end, flags = _INTENT.unpack_from(data)
    if magic != INTENT_MAGIC:
        raise ValueError(f"bad magic {magic!r}")
    if _CRC.unpack_from(data, _INTENT.size)[0] != crc32c(data[: _INTENT.size]):
        raise ValueError("checksum mismatch")
    if flags & ~_RESET:
        raise ValueError(f"unknown flags {flags:#x}")
    return int(end), bool(flags & _RESET)


def read_intent(directory: Path) -> tuple[int, bool] | None:
    """The pending cut of `directory`, None if there is none. Raises ValueError if it is damaged."""
    try:
        data = (directory / INTENT_NAME).read_bytes()
    except FileNotFoundError:
        return None
    return decode_intent(data)


def clip_ranges(ranges: tuple[tuple[int, int], ...], end: int) -> tuple[tuple[int, int], ...]:
    """The parts of (first, end) ranges below `end`."""
    return tuple((a, min(b, end)) for a, b in ranges if a < end)


def frame_position(path: Path, offset: int, position: int, end: int) -> int | None:
    """Byte position where frame `end` starts (after frame end - 1), walking frame headers from the frame
    `offset` at byte `position`; None when the file's frames (by header: offset continuity, length limit,
    the file's size) stop before `end`."""
    if offset == end:
        return position
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        buf = b""
        buf_pos = position
        while offset < end:
            rel = position - buf_pos
            if rel + HEADER_SIZE > len(buf):  # payloads are skipped, only headers are read
                buf = os.pread(fd, WALK_CHUNK, position)
                buf_pos, rel = position, 0
                if len(buf) < HEADER_SIZE:
                    return None
            got, length, _ = HEADER.unpack_from(buf, rel)
            after = position + HEADER_SIZE + length
            if got != offset or length > MAX_FRAME_PAYLOAD or after > size:
                return None
            position = after
            offset += 1
        return position
    finally:
        os.close(fd)


def carry_out(directory: Path, plan: CutPlan, *, intent: bool = True) -> Path:
    """Steps 1..5 of the module docstring (1 only with `intent`); returns the active segment's path.
    Raises OSError; whatever step fails, the next open finds the log old or cut, never in between."""
    if intent:
        replace_file(directory, INTENT_NAME, encode_intent(plan.end, plan.reset))
    write_checkpoint(directory, Checkpoint(plan.end, plan.lost))
    for path in reversed(plan.drop):  # newest first: each state in between is a prefix of the old log
        unlink_segment(path)
    if plan.holder is not None:
        cut_file(plan.holder, plan.position)
        active = plan.holder
    else:
        active = directory / segment_name(plan.end)
        create_empty(active)
    fsync_dir(directory)
    remove_file(directory, INTENT_NAME)
    return active


def unlink_segment(path: Path) -> None:
    path.unlink(missing_ok=True)


def cut_file(path: Path, size: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def create_empty(path: Path) -> None:
    # O_TRUNC, not O_EXCL: an interrupted earlier attempt may have made it already
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def finish_pending_cut(directory: Path) -> int | None:
    """At open, before the segments are scanned: complete a cut a crash interrupted. Returns its end, or
    None when there was none. Raises OSError."""
    try:
        pending = read_intent(directory)
    except ValueError as exc:
        log.error(
            "WAL %s: truncation intent %s is unreadable (%s); ignored, the log reopens as the files hold it",
            directory,
            INTENT_NAME,
            exc,
        )
        remove_file(directory, INTENT_NAME)
        return None
    if pending is None:
        return None
    end, reset = pending
    files = list_segment_files(directory)
    holder: Path | None = None
    position = 0
    if reset:
        drop = [p for _, p in files]
    else:
        drop = [p for first, p in files if first > end]
        kept = [(first, p) for first, p in files if first <= end]
        if kept:
            first, path = kept[-1]
            found = frame_position(path, first, 0, end)
            if found is not None:
                holder, position = path, found
    lost: tuple[tuple[int, int], ...] = ()
    if not reset:
        try:
            ckpt = read_checkpoint(directory)
        except (ValueError, OSError) as exc:
            log.error("WAL %s: high-water checkpoint unreadable while finishing a cut: %s", directory, exc)
            ckpt = None
        lost = () if ckpt is None else clip_ranges(ckpt.lost, end)
    carry_out(directory, CutPlan(end, reset, drop, holder, position, lost), intent=False)
    log.warning(
        "WAL %s: finished an interrupted %s at offset %d",
        directory,
        "reset" if reset else "truncation",
        end,
    )
    return end


__all__ = [
    "INTENT_NAME",
    "CutPlan",
    "carry_out",
    "clip_ranges",
    "decode_intent",
    "encode_intent",
    "finish_pending_cut",
    "frame_position",
    "read_intent",
]
