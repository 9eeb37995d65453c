"""A PublishBatch's `records` when the producer compressed them (ister_v1.proto, docs/compression.md).

The unit of compression is one record, as the WAL stores one record per offset: per-offset reads, acks,
truncation and object indexes stay as they are, and the broker stores the producer's compressed bytes
without compressing anything itself. On the wire a compressed batch is a msgpack array of bin values, each
a stored envelope (`core/compression.py`); `uncompressed_size` is the size of the plain msgpack array of
the same records, so the broker bounds the work before it decompresses anything.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from ister.core.compression import (
    ENVELOPE,
    MARK,
    Codec,
    CompressionError,
    codec_of,
    decompress,
    wrap,
    wrap_with_dictionary,
)
from ister.core.record import array_header
from ister.errors import InvalidArgument
from ister.ids import clip

_bins = msgspec.msgpack.Decoder(list[bytes])
_raws = msgspec.msgpack.Decoder(list[msgspec.Raw])
_encode = msgspec.msgpack.Encoder().encode


def compress_batch(codec: Codec, plain: bytes, dict_id: int = 0) -> tuple[bytes, int]:
    """The producer's side: the plain msgpack array of records as (compressed records, uncompressed size).
    `dict_id` (zstd only): compress with that dictionary of `core.zdict.REGISTRY` (the broker must hold it,
    or it refuses the batch)."""
    records = _raws.decode(plain)
    if dict_id and codec is Codec.ZSTD:
        return _encode([wrap_with_dictionary(dict_id, r) for r in records]), len(plain)
    return _encode([wrap(codec, r) for r in records]), len(plain)


def decompress_batch(
    codec_id: int, data: bytes, count: int, uncompressed_size: int, limit: int
) -> tuple[bytes, list[bytes]]:
    """The broker's side: (the plain msgpack array of the records, each record as stored). Checks, before
    decompressing anything, that the codec is known, every envelope names it, the sizes add up to
    `uncompressed_size` and that is at most `limit`; then that each record decompresses to exactly its
    size. CompressionError (INVALID_ARGUMENT) otherwise."""
    codec = codec_of(codec_id)
    if codec is Codec.NONE:
        raise CompressionError("codec 0 (none) takes plain records")
    if uncompressed_size > limit:
        raise CompressionError(f"uncompressed_size {uncompressed_size} exceeds {limit} bytes")
    try:
        stored = _bins.decode(data)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise InvalidArgument(
            "compressed records must be a msgpack array of bin: " + clip(str(exc))
        ) from None
    n = len(stored)
    if n != count:
        raise InvalidArgument(f"{n} records, count says {count}")
    sizes = _sizes(codec, stored)
    head = array_header(n)
    total = len(head) + sum(sizes)
    if total != uncompressed_size:
        said = uncompressed_size
        raise CompressionError(f"the records' sizes add up to {total}, uncompressed_size says {said}")
    parts: list[bytes] = [head]
    for i, (record, size) in enumerate(zip(stored, sizes, strict=True)):
        try:
            parts.append(decompress(codec, memoryview(record)[ENVELOPE.size :], size))
        except CompressionError as exc:
            raise CompressionError(f"record {i}: {exc}") from None
    return b"".join(parts), stored


def _sizes(codec: Codec, stored: Sequence[bytes]) -> list[int]:
    sizes = []
    unpack = ENVELOPE.unpack_from
    for i, record in enumerate(stored):
        if len(record) < ENVELOPE.size:
            raise CompressionError(f"record {i}: {len(record)} bytes is shorter than its envelope")
        mark, c, size = unpack(record)
        if mark != MARK or c != codec:
            raise CompressionError(f"record {i}: not a record compressed with codec {int(codec)}")
        sizes.append(size)
    return sizes
