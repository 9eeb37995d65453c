"""A replica's epoch history file, kept in its WAL directory (blocking; run in a thread). See
docs/formats.md and docs/replication.md.

`<wal dir>/epochs.ckpt` holds `ister.core.replication.EpochHistory`: (epoch, first offset) of each leader
epoch that has records in the log. Layout, little-endian: magic `ISTREPH1` (8 bytes), count u32, count x
(epoch u64, first offset u64), CRC-32C u32 of everything before it. Replaced atomically (tmp file, fsync,
rename, directory fsync).

Ordering rules for the caller, so that a crash never attributes records to the wrong epoch:
* before appending the first record of a new epoch, `begin` it and save the history (an entry past the
  log's end is harmless: `history.truncate(wal.next_offset)` after loading drops it);
* when cutting the log, truncate the WAL first, then `truncate` the history and save it (the other order
  would leave records of a forgotten epoch in the log, counted as the previous epoch's).
A missing file means no history yet. A damaged one must be treated as no history: the replica then cuts
its log to what the leader confirms, never trusting records it cannot place in an epoch.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Literal

from crc32c import crc32c

from ister.core.replication import EpochHistory
from ister.errors import StorageError

from .durable import replace_file

EPOCHS_NAME = "epochs.ckpt"
MAGIC = b"ISTREPH1"
MAX_EPOCHS = 65536  # 1 MiB; a history this long means epochs are never trimmed below the log start
_HEAD = struct.Struct("<8sI")
_ENTRY = struct.Struct("<QQ")
_CRC = struct.Struct("<I")

EpochFileStatus = Literal["ok", "missing", "damaged"]


@dataclass(frozen=True, slots=True)
class LoadedEpochs:
    status: EpochFileStatus
    history: EpochHistory = field(default_factory=EpochHistory)  # empty unless status == "ok"
    problem: str = ""  # what is wrong with a damaged file


def _check(entries: list[tuple[int, int]]) -> None:
    if len(entries) > MAX_EPOCHS:
        raise ValueError(f"{len(entries)} epochs, at most {MAX_EPOCHS}")
    for epoch, first in entries:
        if not (0 <= epoch < 1 << 64 and 0 <= first < 1 << 64):
            raise ValueError(f"entry ({epoch}, {first}) out of range")
    if any(a[0] >= b[0] or a[1] >= b[1] for a, b in pairwise(entries)):
        raise ValueError("epochs and their first offsets must both ascend")


def encode(history: EpochHistory) -> bytes:
    """Raises ValueError for a history that is not ascending (or too long)."""
    _check(history.entries)
    body = _HEAD.pack(MAGIC, len(history.entries)) + b"".join(_ENTRY.pack(e, f) for e, f in history.entries)
    return body + _CRC.pack(crc32c(body))


def decode(data: bytes) -> EpochHistory:
    """Raises ValueError naming what is wrong."""
    if len(data) < _HEAD.size + _CRC.size:
        raise ValueError(f"{len(data)} bytes is too short")
    magic, count = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise ValueError(f"bad magic {magic!r}")
    if count > MAX_EPOCHS or len(data) != _HEAD.size + count * _ENTRY.size + _CRC.size:
        raise ValueError(f"size {len(data)} does not match {count} entries")
    (crc,) = _CRC.unpack_from(data, len(data) - _CRC.size)
    if crc32c(data[: -_CRC.size]) != crc:
        raise ValueError("checksum mismatch")
    entries = [
        (int(e), int(f))
        for e, f in (_ENTRY.unpack_from(data, _HEAD.size + i * _ENTRY.size) for i in range(count))
    ]
    _check(entries)
    return EpochHistory(entries)


def load_epochs(directory: Path) -> LoadedEpochs:
    """The history saved in `directory`: status "ok", "missing" (no file) or "damaged" (a file that fails
    its checks; `problem` says how). Raises StorageError when the file cannot be read at all (an I/O
    error says nothing about its content: the caller retries or gives up, it does not assume a history)."""
    path = directory / EPOCHS_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return LoadedEpochs("missing")
    except OSError as exc:
        raise StorageError(f"cannot read the epoch history {path}: {exc}") from exc
    try:
        return LoadedEpochs("ok", decode(data))
    except ValueError as exc:
        return LoadedEpochs("damaged", problem=f"{path}: {exc}")


def save_epochs(directory: Path, history: EpochHistory) -> None:
    """Atomically replace the history in `directory`. Raises ValueError for an invalid history (nothing
    written) and StorageError when the disk fails (the previous file stays, or the new one is in place but
    perhaps not durable: save again)."""
    data = encode(history)
    try:
        replace_file(directory, EPOCHS_NAME, data)
    except OSError as exc:
        raise StorageError(f"cannot write the epoch history in {directory}: {exc}") from exc


__all__ = [
    "EPOCHS_NAME",
    "MAX_EPOCHS",
    "EpochFileStatus",
    "LoadedEpochs",
    "decode",
    "encode",
    "load_epochs",
    "save_epochs",
]
