"""Record compression: the codecs and the stored envelope of a compressed record (docs/compression.md).

A stored record (a WAL frame's payload) is either a plain msgpack array (its first byte 0x90..0x9f, 0xdc or
0xdd) or a compressed one:

    0xC1 | codec u8 | uncompressed size u32 LE | the codec's bytes of the plain record

0xC1 is the one byte msgpack never uses, so the first byte tells the two apart and every record written
before compression existed reads as before. The frame's CRC-32C covers the envelope as stored.

Codec ids follow Kafka's: none 0, gzip 1, snappy 2, lz4 3, zstd 4. lz4 is the block format and snappy the
raw format (the envelope carries the size); zstd is a zstd frame, gzip an RFC 1952 member. Decompression
is bounded: the declared size is checked against a limit first and the output buffer holds exactly it.

Records are small (a 1 KiB log line), so the cost of a call matters more than a codec's stream speed:
zstd keeps one compression and one decompression context per thread (python-zstandard; a new context per
call was 3 to 6 times slower), and gzip sizes its window and hash tables to the record.
"""

from __future__ import annotations

import enum
import struct
import threading
import zlib

import cramjam
import msgspec
import zstandard

from ister.core.frames import MAX_FRAME_PAYLOAD
from ister.core.zdict import REGISTRY, DictionaryRegistry, dict_id_of
from ister.errors import InvalidArgument

Buffer = bytes | memoryview | msgspec.Raw
MARK = 0xC1
ENVELOPE = struct.Struct("<BBI")  # mark, codec, uncompressed size
ENVELOPE_SIZE = ENVELOPE.size  # 6
ZSTD_LEVEL = 3  # zstd's own default
GZIP_LEVEL = 6  # zlib's default


class Codec(enum.IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


NAMES = {c: c.name.lower() for c in Codec}


class CompressionError(InvalidArgument):
    """Compressed bytes that do not decompress to what their envelope says (corrupt, wrong size, unknown
    codec). INVALID_ARGUMENT on publish; a reader treats such a stored record as corrupt."""


class MissingDictionary(CompressionError):
    """A zstd frame names a dictionary this process has not loaded. A client fetches it from the broker
    (GetCompressionDictionary) and decodes again; elsewhere it is a CompressionError like any other."""

    def __init__(self, dict_id: int) -> None:
        super().__init__(f"zstd frame needs dictionary {dict_id}, which is not loaded")
        self.dict_id = dict_id


def parse_codec(name: str) -> Codec:
    """A codec by name (none, gzip, snappy, lz4, zstd; case-insensitive)."""
    for codec, n in NAMES.items():
        if n == name.strip().lower():
            return codec
    raise InvalidArgument(f"unknown compression {name!r}; one of: {', '.join(NAMES.values())}")


def codec_of(value: int) -> Codec:
    try:
        return Codec(value)
    except ValueError:
        raise CompressionError(f"unknown codec id {value}") from None


class _Contexts(threading.local):
    def __init__(self) -> None:
        self.zc = zstandard.ZstdCompressor(level=ZSTD_LEVEL)  # writes the content size in the frame
        self.zd = zstandard.ZstdDecompressor()


_ctx = _Contexts()


def _gzip(data: bytes | memoryview) -> bytes:
    # A window (and hash tables) no larger than the record: zlib's defaults cost about twice as much to set
    # up per 1 KiB record, and a record cannot refer further back than its own start anyway.
    bits = min(15, max(9, len(data).bit_length()))
    c = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 16 + bits, max(1, min(8, bits - 7)))
    return c.compress(data) + c.flush()


def _unzstd(data: bytes | memoryview, size: int, dicts: DictionaryRegistry) -> bytes:
    # One frame that states its content size (ours always do), checked before anything is allocated: the
    # one-shot decompression then writes into exactly that many bytes, and no byte may follow the frame.
    declared = zstandard.frame_content_size(data)
    if declared != size:
        stated = "no size" if declared == -1 else f"{declared} bytes"
        raise CompressionError(f"zstd frame states {stated}, the size says {size}")
    zd = _ctx.zd
    dict_id = dict_id_of(data)  # a frame made with a dictionary names it (core/zdict.py)
    if dict_id:
        found = dicts.decompressor(dict_id)
        if found is None:
            raise MissingDictionary(dict_id)
        zd = found
    got: bytes = zd.decompress(data, max_output_size=size, allow_extra_data=False)
    if len(got) != size:
        raise CompressionError(f"zstd data holds {len(got)} bytes, the size says {size}")
    return got


def compress(codec: Codec, data: bytes | memoryview) -> bytes:
    """The codec's bytes of `data` (no envelope)."""
    if codec is Codec.LZ4:
        return bytes(cramjam.lz4.compress_block(data, store_size=False))
    if codec is Codec.ZSTD:
        return _ctx.zc.compress(data)
    if codec is Codec.SNAPPY:
        return bytes(cramjam.snappy.compress_raw(data))
    if codec is Codec.GZIP:
        return _gzip(data)
    return bytes(data)


def decompress(
    codec: Codec, data: bytes | memoryview, size: int, dicts: DictionaryRegistry = REGISTRY
) -> bytes:
    """`data` decompressed, which must be exactly `size` bytes; CompressionError otherwise. At most
    `size + 1` bytes are ever produced, so a small input cannot expand past its declared size. A zstd frame
    that names a dictionary is decompressed with it from `dicts` (unknown: CompressionError)."""
    if codec is Codec.NONE:
        if len(data) != size:
            raise CompressionError(f"{len(data)} bytes, the size says {size}")
        return bytes(data)
    try:
        if codec is Codec.ZSTD:
            return _unzstd(data, size, dicts)
        if codec is Codec.GZIP:
            return _ungzip(data, size)
        out = bytearray(size + 1)  # one spare byte: an input that holds more than `size` shows itself
        if codec is Codec.LZ4:
            n = cramjam.lz4.decompress_block_into(data, out)
        else:
            stated = cramjam.snappy.decompress_raw_len(data)
            if stated != size:
                raise CompressionError(f"snappy data of {stated} bytes, the size says {size}")
            n = cramjam.snappy.decompress_raw_into(data, out)
    except CompressionError:
        raise
    except Exception as exc:  # cramjam.DecompressionError, zstandard.ZstdError, zlib.error: the bytes are bad
        raise CompressionError(f"{NAMES[codec]} data does not decompress: {exc}") from None
    if n != size:
        held = n if n <= size else "more than"
        raise CompressionError(f"{NAMES[codec]} data holds {held} bytes, the size says {size}")
    del out[size:]
    return bytes(out)


def _ungzip(data: bytes | memoryview, size: int) -> bytes:
    d = zlib.decompressobj(31)
    got = d.decompress(data, size + 1)  # at most one byte more than the size
    if not d.eof or d.unused_data or d.unconsumed_tail:
        raise CompressionError("gzip data is truncated, too long or followed by other bytes")
    if len(got) != size:
        raise CompressionError(f"gzip data holds {len(got)} bytes, the size says {size}")
    return got


# -- the stored envelope -----------------------------------------------------------------------------------


def is_compressed(record: bytes | memoryview) -> bool:
    return len(record) > 0 and record[0] == MARK


def wrap(codec: Codec, record: bytes | memoryview) -> bytes:
    """A plain record as stored with `codec` (the record itself, as bytes, for Codec.NONE)."""
    if codec is Codec.NONE:
        return bytes(record)
    return ENVELOPE.pack(MARK, codec, len(record)) + compress(codec, record)


def wrap_with_dictionary(
    dict_id: int, record: bytes | memoryview, dicts: DictionaryRegistry = REGISTRY
) -> bytes:
    """A plain record stored as zstd with dictionary `dict_id` (its frame names the dictionary)."""
    return ENVELOPE.pack(MARK, Codec.ZSTD, len(record)) + dicts.compressor(dict_id).compress(record)


def uses_dictionary(record: Buffer) -> bool:
    """A stored record compressed with a zstd dictionary (a reader needs the dictionary): one byte of the
    frame's descriptor says whether the frame names one."""
    view = record if isinstance(record, bytes | memoryview) else memoryview(record)
    return (
        len(view) > ENVELOPE_SIZE + 4
        and view[0] == MARK
        and view[1] == Codec.ZSTD
        and bool(view[ENVELOPE_SIZE + 4] & 0x03)
    )


def dictionary_of(record: Buffer) -> int:
    """The id of the zstd dictionary a stored record was compressed with (0: none, or not a zstd frame)."""
    if not uses_dictionary(record):
        return 0
    view = record if isinstance(record, bytes | memoryview) else memoryview(record)
    try:
        return dict_id_of(memoryview(view)[ENVELOPE_SIZE:])
    except ValueError:
        return 0  # damage: decompressing it says so


def missing_dictionary(record: Buffer, dicts: DictionaryRegistry = REGISTRY) -> bool:
    """A record compressed with a zstd dictionary this process has not loaded (a reader outside the broker,
    e.g. a Spark executor reading objects, then asks the broker, which has it)."""
    if not uses_dictionary(record):
        return False
    view = record if isinstance(record, bytes | memoryview) else memoryview(record)
    try:
        return dict_id_of(memoryview(view)[ENVELOPE_SIZE:]) not in dicts
    except ValueError:
        return False  # damage: the reader's own error says so


def envelope(record: bytes | memoryview) -> tuple[Codec, int]:
    """(codec, uncompressed size) of a compressed record; CompressionError when it is not one."""
    if len(record) < ENVELOPE_SIZE or record[0] != MARK:
        raise CompressionError("not a compressed record")
    _, codec, size = ENVELOPE.unpack_from(record)
    return codec_of(codec), size


def unwrap(record: bytes | memoryview, limit: int = MAX_FRAME_PAYLOAD) -> bytes:
    """The plain record of a compressed one; its declared size must be at most `limit`."""
    codec, size = envelope(record)
    if codec is Codec.NONE:
        raise CompressionError("a compressed record must name a codec")
    if size > limit:
        raise CompressionError(f"uncompressed size {size} exceeds the limit of {limit} bytes")
    return decompress(codec, memoryview(record)[ENVELOPE_SIZE:], size)


def plain(record: Buffer, limit: int = MAX_FRAME_PAYLOAD) -> Buffer:
    """The record as a reader decodes it: itself when plain (no copy), else decompressed. Takes any buffer
    (bytes, memoryview, a msgspec.Raw as some WAL readers hand records out)."""
    view = record if isinstance(record, bytes | memoryview) else memoryview(record)
    if len(view) and view[0] == MARK:
        return unwrap(view, limit)
    return record
