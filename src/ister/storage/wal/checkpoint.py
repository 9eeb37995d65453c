"""The WAL's high-water checkpoint file (blocking; run in a thread). See docs/formats.md.

`<wal dir>/highwater.ckpt` records the highest committed next offset (every offset below it was handed out
and acknowledged) and the ranges known to be lost. Recovery never starts below it, so a segment damaged or
cut short below the mark cannot make the WAL hand out an acknowledged offset again; the lost ranges keep
such holes readable-around after the next restart (they look like any gap between segment files otherwise).

Two layouts, little-endian. v1 (one checkpoint): magic `ISTRHWM1` (8 bytes), next_offset u64, count u32,
count x (first u64, end u64) lost ranges (end exclusive), CRC-32C u32 of everything before it. v2 (two
slots of SLOT_SIZE bytes, the file is exactly 2 x SLOT_SIZE): each slot holds magic `ISTRHWM2`, seq u64,
next_offset u64, count u32, the ranges, CRC-32C u32 of the slot's bytes before it, then zeros; the valid
slot with the higher seq is the checkpoint.

A file is created whole (tmp file, fsync, rename, directory fsync): v2 with the checkpoint in slot 0, or v1
when its lost ranges do not fit a slot. After that a WAL's writer (`CheckpointFile`) overwrites the slot
that does not hold the newest durable checkpoint and flushes it: one write and one flush instead of a file
created, renamed and two flushes. A torn or failed slot write leaves the other slot, the previous checkpoint.
"""

from __future__ import annotations

import contextlib
import errno
import os
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

from crc32c import crc32c

from .durable import replace_file, write_all

CHECKPOINT_NAME = "highwater.ckpt"
TMP_NAME = CHECKPOINT_NAME + ".tmp"
MAGIC = b"ISTRHWM1"
MAGIC_V2 = b"ISTRHWM2"
MAX_LOST_RANGES = 1024  # the newest ones are kept
SLOT_SIZE = 512  # a v2 file is two of them: one page, one block
_HEAD = struct.Struct("<8sQI")
_SLOT_HEAD = struct.Struct("<8sQQI")
_RANGE = struct.Struct("<QQ")
_CRC = struct.Struct("<I")
SLOT_RANGES = (SLOT_SIZE - _SLOT_HEAD.size - _CRC.size) // _RANGE.size  # 30; more: the file is v1


@dataclass(frozen=True, slots=True)
class Checkpoint:
    next_offset: int
    lost: tuple[tuple[int, int], ...] = field(default=())  # (first, end) with end exclusive, by first


def encode(checkpoint: Checkpoint) -> bytes:
    lost = checkpoint.lost[-MAX_LOST_RANGES:]
    body = _HEAD.pack(MAGIC, checkpoint.next_offset, len(lost)) + b"".join(_RANGE.pack(a, b) for a, b in lost)
    return body + _CRC.pack(crc32c(body))


def decode(data: bytes) -> Checkpoint:
    """Raises ValueError naming what is wrong."""
    if len(data) < _HEAD.size + _CRC.size:
        raise ValueError(f"{len(data)} bytes is too short")
    magic, next_offset, count = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise ValueError(f"bad magic {magic!r}")
    if count > MAX_LOST_RANGES or len(data) != _HEAD.size + count * _RANGE.size + _CRC.size:
        raise ValueError(f"size {len(data)} does not match {count} ranges")
    (crc,) = _CRC.unpack_from(data, len(data) - _CRC.size)
    if crc32c(data[: -_CRC.size]) != crc:
        raise ValueError("checksum mismatch")
    lost = tuple(
        (int(a), int(b))
        for a, b in (_RANGE.unpack_from(data, _HEAD.size + i * _RANGE.size) for i in range(count))
    )
    _check_ranges(next_offset, lost)
    return Checkpoint(int(next_offset), lost)


def _check_ranges(next_offset: int, lost: tuple[tuple[int, int], ...]) -> None:
    if any(a >= b or b > next_offset for a, b in lost) or any(x[1] > y[0] for x, y in pairwise(lost)):
        raise ValueError("lost ranges are not ordered, disjoint and below the mark")


def read_checkpoint(directory: Path) -> Checkpoint | None:
    """The checkpoint of `directory`, None if there is none. Raises ValueError if it is damaged."""
    try:
        data = (directory / CHECKPOINT_NAME).read_bytes()
    except FileNotFoundError:
        return None
    if data[: len(MAGIC)] == MAGIC:
        return decode(data)
    if len(data) != 2 * SLOT_SIZE:
        raise ValueError(f"{len(data)} bytes is neither a v1 checkpoint nor two slots")
    slots: list[tuple[int, Checkpoint]] = []
    errors: list[str] = []
    for i in (0, 1):
        try:
            slots.append(decode_slot(data[i * SLOT_SIZE : (i + 1) * SLOT_SIZE]))
        except ValueError as exc:
            errors.append(f"slot {i}: {exc}")
    if not slots:
        raise ValueError("; ".join(errors))
    return max(slots, key=lambda s: s[0])[1]


def encode_slot(seq: int, checkpoint: Checkpoint) -> bytes:
    """One v2 slot, SLOT_SIZE bytes. The checkpoint must fit (`fits_slot`)."""
    lost = checkpoint.lost
    assert len(lost) <= SLOT_RANGES
    body = _SLOT_HEAD.pack(MAGIC_V2, seq, checkpoint.next_offset, len(lost)) + b"".join(
        _RANGE.pack(a, b) for a, b in lost
    )
    body += _CRC.pack(crc32c(body))
    return body + bytes(SLOT_SIZE - len(body))


def decode_slot(data: bytes) -> tuple[int, Checkpoint]:
    """(seq, checkpoint) of one v2 slot. Raises ValueError naming what is wrong (also: never written)."""
    magic, seq, next_offset, count = _SLOT_HEAD.unpack_from(data)
    if magic != MAGIC_V2:
        raise ValueError("empty" if magic == bytes(len(MAGIC_V2)) else f"bad magic {magic!r}")
    if count > SLOT_RANGES:
        raise ValueError(f"{count} ranges do not fit a slot")
    end = _SLOT_HEAD.size + count * _RANGE.size
    (crc,) = _CRC.unpack_from(data, end)
    if crc32c(data[:end]) != crc:
        raise ValueError("checksum mismatch")
    lost = tuple(
        (int(a), int(b))
        for a, b in (_RANGE.unpack_from(data, _SLOT_HEAD.size + i * _RANGE.size) for i in range(count))
    )
    _check_ranges(next_offset, lost)
    return int(seq), Checkpoint(int(next_offset), lost)


def fits_slot(checkpoint: Checkpoint) -> bool:
    return len(checkpoint.lost) <= SLOT_RANGES


def _file_bytes(checkpoint: Checkpoint) -> bytes:
    """A new file holding `checkpoint`: v2 with it in slot 0 (seq 1), or v1 if it does not fit a slot."""
    if fits_slot(checkpoint):
        return encode_slot(1, checkpoint) + bytes(SLOT_SIZE)
    return encode(checkpoint)


def write_checkpoint(directory: Path, checkpoint: Checkpoint) -> None:
    """Atomically replace the checkpoint file (tmp file, fsync, rename, directory fsync). Raises OSError; a
    failure leaves the previous checkpoint in place. A `CheckpointFile` of the same directory must be
    told (`replaced`)."""
    replace_file(directory, CHECKPOINT_NAME, _file_bytes(checkpoint))


class CheckpointFile:
    """One WAL's checkpoint file as its writer (one thread at a time) keeps writing it."""

    __slots__ = ("_newest", "_seq", "directory")

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._seq = 0  # the newest durable slot's seq; 0: the next write replaces the file
        self._newest = 0  # the slot holding it

    def replaced(self, checkpoint: Checkpoint | None = None) -> None:
        """The file was replaced by a new one holding `checkpoint` (`write_checkpoint`); None: by something
        else, or not known to be durable (a cut): the next write replaces it again."""
        self._seq = 1 if checkpoint is not None and fits_slot(checkpoint) else 0
        self._newest = 0

    def write(self, checkpoint: Checkpoint) -> None:
        """Make `checkpoint` the durable one. Raises OSError; the previous checkpoint is then still there."""
        if self._seq == 0 or not fits_slot(checkpoint):
            self._replace(checkpoint)
            return
        try:
            fd = self._overwrite(checkpoint)
        except FileNotFoundError:  # deleted by hand: made again
            self._replace(checkpoint)
            return
        try:
            os.fdatasync(fd)  # the file's size never changes: its data is all there is to flush
        finally:
            os.close(fd)
        self._advance()

    def stage(self, checkpoint: Checkpoint) -> int | None:
        """Write `checkpoint` into the free slot without flushing it; `staged_durable()` once a syncfs made it
        durable (until then the next write goes to the same slot). Returns the open descriptor (the caller
        closes it), None if this one must be replaced (`write`) instead. Raises OSError."""
        if self._seq == 0 or not fits_slot(checkpoint):
            return None
        try:
            fd = self._overwrite(checkpoint)
        except FileNotFoundError:  # deleted by hand: made again
            self.replaced()
            return None
        return fd

    def staged_durable(self) -> None:
        """The slot the last `stage` wrote is durable (a syncfs after it succeeded)."""
        self._advance()

    def _overwrite(self, checkpoint: Checkpoint) -> int:
        slot = 1 - self._newest
        fd = os.open(self.directory / CHECKPOINT_NAME, os.O_WRONLY | os.O_CLOEXEC)
        try:
            data = encode_slot(self._seq + 1, checkpoint)
            if os.pwrite(fd, data, slot * SLOT_SIZE) != len(data):
                raise OSError(errno.EIO, "short write of a checkpoint slot")
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _advance(self) -> None:
        self._seq += 1
        self._newest = 1 - self._newest

    def _replace(self, checkpoint: Checkpoint) -> None:
        self.replaced()  # until the new file is durable, nothing is known of the one in place
        write_checkpoint(self.directory, checkpoint)
        self.replaced(checkpoint)


def _write_unsynced(file: CheckpointFile, checkpoint: Checkpoint) -> tuple[int, bool]:
    """Write `checkpoint` into the file's free slot, or else into its tmp file; nothing flushed. Returns the
    open descriptor and whether the tmp file must be renamed. Raises OSError (no tmp file is left)."""
    fd = file.stage(checkpoint)
    if fd is not None:
        return fd, False
    tmp = file.directory / TMP_NAME
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            write_all(fd, _file_bytes(checkpoint))
        except BaseException:
            os.close(fd)
            raise
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return fd, True


def write_checkpoints(
    items: Sequence[tuple[CheckpointFile, Checkpoint]], syncfs: Callable[[int], None]
) -> list[OSError | None]:
    """Write the checkpoints of several WALs on one filesystem with one syncfs (two if a file must be
    replaced): every slot overwritten (or tmp file written), one syncfs, then the renames and one more syncfs.
    Returns, per item, None or the OSError that kept it from being written (its previous checkpoint is
    still in place). Raises OSError if a syncfs fails: then none is known durable, and the caller writes
    each the usual way (`CheckpointFile.write`), which also makes good any rename already done."""
    results: list[OSError | None] = [None] * len(items)
    staged: list[int] = []
    renamed: list[int] = []  # written to their tmp file, to be renamed
    anchor: int | None = None  # an open descriptor on the filesystem, opened before the writes, for syncfs
    try:
        for i, (file, checkpoint) in enumerate(items):
            try:
                fd, rename = _write_unsynced(file, checkpoint)
            except OSError as exc:
                results[i] = exc
                continue
            if anchor is None:
                anchor = fd
            else:
                os.close(fd)
            (renamed if rename else staged).append(i)
        if anchor is None:
            return results
        syncfs(anchor)
        for i in staged:
            items[i][0].staged_durable()
        for i in renamed:
            file = items[i][0]
            file.replaced()  # the slots it knew are gone with the old file
            try:
                os.rename(file.directory / TMP_NAME, file.directory / CHECKPOINT_NAME)
            except OSError as exc:
                results[i] = exc
                with contextlib.suppress(OSError):
                    os.unlink(file.directory / TMP_NAME)
        if renamed:
            syncfs(anchor)
            for i in renamed:
                if results[i] is None:
                    file, checkpoint = items[i]
                    file.replaced(checkpoint)
    finally:
        if anchor is not None:
            os.close(anchor)
    return results


__all__ = [
    "CHECKPOINT_NAME",
    "MAX_LOST_RANGES",
    "SLOT_RANGES",
    "SLOT_SIZE",
    "Checkpoint",
    "CheckpointFile",
    "decode",
    "decode_slot",
    "encode",
    "encode_slot",
    "fits_slot",
    "read_checkpoint",
    "write_checkpoint",
    "write_checkpoints",
]


def record_gap(directory: Path, start: int, end: int) -> None:
    """Record offsets `start`..`end - 1` as lost in a closed WAL's checkpoint and move its mark to `end`,
    so that the next open continues at `end` and keeps the older segments (readers skip the gap, or read
    it from the durable tier where that holds it). For an unclean recovery: those offsets may have been
    handed out by a dead leader and must never be handed out again. Nothing to do when `start >= end`."""
    if start >= end:
        return
    old = read_checkpoint(directory)
    lost = list(old.lost) if old is not None else []
    start = max(start, lost[-1][1] if lost else 0)
    mark = max(end, old.next_offset if old is not None else 0)
    if start < end:
        lost.append((start, end))
    write_checkpoint(directory, Checkpoint(mark, tuple(lost)))
