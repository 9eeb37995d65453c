"""Compressed records on the batch API (docs/compression.md): a producer's compressed batch in, and plain
records out to consumers that did not ask for compressed ones (older clients). Records compressed with a
zstd dictionary go plain to every client: a client has no way to fetch a dictionary."""

from __future__ import annotations

from typing import Any

from crc32c import crc32c

from ister.core.compressed_batch import decompress_batch
from ister.core.compression import MARK, Buffer, CompressionError, plain, uses_dictionary
from ister.core.frames import HEADER, HEADER_SIZE
from ister.errors import CorruptionError, InvalidArgument


def unpack_compressed(batch: Any, limit: int) -> tuple[bytes | None, list[bytes] | None]:
    """(plain records, records as stored) of a compressed PublishBatch; (None, None) for a plain one."""
    if not batch.codec:
        return None, None
    try:
        return decompress_batch(batch.codec, batch.records, batch.count, batch.uncompressed_size, limit)
    except InvalidArgument as exc:
        raise InvalidArgument(f"batch {batch.sequence}: {exc}") from None


def plain_record(record: Buffer) -> Buffer:
    """A stored record as a consumer without `accept_compressed` gets it (itself when plain). Its frame's
    CRC was checked when it was read, so bytes that do not decompress are damage, not a client's error."""
    try:
        return plain(record)
    except CompressionError as exc:
        raise CorruptionError(f"a stored compressed record does not decompress: {exc}") from None


def client_record(record: Buffer, accept: bool) -> Buffer:
    """A stored record as a consumer gets it: as stored when it accepts compressed records and the record
    needs no dictionary, plain otherwise."""
    return plain_record(record) if not accept or uses_dictionary(record) else record


def client_frames(frames: bytes | memoryview, accept: bool) -> bytes | memoryview:
    """`plain_frames` for a consumer: only the records with a dictionary when it accepts compressed ones."""
    return plain_frames(frames, only_dictionary=accept)


def plain_frames(frames: bytes | memoryview, only_dictionary: bool = False) -> bytes | memoryview:
    """Back-to-back WAL frames (already checked) with every compressed record (`only_dictionary`: every one
    compressed with a zstd dictionary) replaced by its plain one and framed again; the same object when
    there is none."""
    mv = memoryview(frames)
    unpack, pack = HEADER.unpack_from, HEADER.pack
    parts: list[Buffer] = []
    pos = done = 0
    while pos + HEADER_SIZE <= len(mv):
        offset, length, _ = unpack(mv, pos)
        body = pos + HEADER_SIZE
        if length and mv[body] == MARK and (not only_dictionary or uses_dictionary(mv[body : body + length])):
            record = plain_record(mv[body : body + length])
            parts += [mv[done:pos], pack(offset, len(record), crc32c(record)), record]
            done = body + length
        pos = body + length
    if not parts:
        return frames
    parts.append(mv[done:])
    return b"".join(parts)
