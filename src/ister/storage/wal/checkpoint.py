"""The WAL's high-water checkpoint file (blocking; run in a thread). See docs/formats.md.

`<wal dir>/highwater.ckpt` records the highest committed next offset (every offset below it was handed out
and acknowledged) and the ranges known to be lost. Recovery never starts below it, so a segment damaged or
cut short below the mark cannot make the WAL hand out an acknowledged offset again; the lost ranges keep
such holes readable-around after the next restart (they look like any gap between segment files otherwise).

Layout, little-endian: magic `ISTRHWM1` (8 bytes), next_offset u64, count u32, count x (first u64, end u64)
lost ranges (end exclusive), CRC-32C u32 of everything before it. Written to `highwater.ckpt.tmp`, fsync'd,
renamed over the old file, then the directory is fsync'd: a reader sees the old or the new file, never a mix.
"""

from __future__ import annotations

import contextlib
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
MAX_LOST_RANGES = 1024  # the newest ones are kept
_HEAD = struct.Struct("<8sQI")
_RANGE = struct.Struct("<QQ")
_CRC = struct.Struct("<I")


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
    if any(a >= b or b > next_offset for a, b in lost) or any(x[1] > y[0] for x, y in pairwise(lost)):
        raise ValueError("lost ranges are not ordered, disjoint and below the mark")
    return Checkpoint(int(next_offset), lost)


def read_checkpoint(directory: Path) -> Checkpoint | None:
    """The checkpoint of `directory`, None if there is none. Raises ValueError if it is damaged."""
    try:
        data = (directory / CHECKPOINT_NAME).read_bytes()
    except FileNotFoundError:
        return None
    return decode(data)


def write_checkpoint(directory: Path, checkpoint: Checkpoint) -> None:
    """Atomically replace the checkpoint (tmp file, fsync, rename, directory fsync). Raises OSError; a
    failure leaves the previous checkpoint in place."""
    replace_file(directory, CHECKPOINT_NAME, encode(checkpoint))


def write_checkpoints(
    items: Sequence[tuple[Path, Checkpoint]], syncfs: Callable[[int], None]
) -> list[OSError | None]:
    """Replace the checkpoints of several WALs on one filesystem with two syncfs calls in all: every tmp
    file written, one syncfs (their contents durable), every rename, one more syncfs (the renames durable).
    Returns, per item, None or the OSError that kept it from being replaced (its previous checkpoint is
    still in place). Raises OSError if a syncfs fails: then none is known durable, and the caller writes
    each the usual way (write_checkpoint), which also makes good any rename already done."""
    results: list[OSError | None] = [None] * len(items)
    written: list[int] = []
    anchor: int | None = None  # an open descriptor on the filesystem, for syncfs
    try:
        for i, (directory, checkpoint) in enumerate(items):
            tmp = directory / TMP_NAME
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
                try:
                    write_all(fd, encode(checkpoint))
                finally:
                    if anchor is None:
                        anchor = fd
                    else:
                        os.close(fd)
            except OSError as exc:
                results[i] = exc
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            else:
                written.append(i)
        if anchor is None:
            return results
        syncfs(anchor)
        for i in written:
            directory = items[i][0]
            try:
                os.rename(directory / TMP_NAME, directory / CHECKPOINT_NAME)
            except OSError as exc:
                results[i] = exc
                with contextlib.suppress(OSError):
                    os.unlink(directory / TMP_NAME)
        syncfs(anchor)
    finally:
        if anchor is not None:
            os.close(anchor)
    return results


__all__ = [
    "CHECKPOINT_NAME",
    "MAX_LOST_RANGES",
    "Checkpoint",
    "decode",
    "encode",
    "read_checkpoint",
    "write_checkpoint",
    "write_checkpoints",
]
