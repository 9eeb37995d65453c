"""The codecs and the stored envelope of a compressed record (ister.core.compression)."""

from __future__ import annotations

import os
import random

import pytest

from ister.core.compression import (
    ENVELOPE,
    ENVELOPE_SIZE,
    MARK,
    Codec,
    CompressionError,
    compress,
    decompress,
    envelope,
    parse_codec,
    plain,
    unwrap,
    wrap,
)
from ister.core.record import StoredMessage, decode_message, encode_message
from ister.errors import InvalidArgument

CODECS = [c for c in Codec if c is not Codec.NONE]
TEXT = b'{"level":"info","msg":"request served","path":"/api/v1/items","status":200}\n' * 20


# Seeded: pytest-xdist workers must collect the same parameters (and ids) as each other.
RANDOM = random.Random(5000).randbytes(5000)


@pytest.mark.parametrize("codec", list(Codec))
@pytest.mark.parametrize("data", [b"", b"x", TEXT, RANDOM], ids=["empty", "one", "text", "random"])
def test_round_trip(codec: Codec, data: bytes) -> None:
    assert decompress(codec, compress(codec, data), len(data)) == data


@pytest.mark.parametrize("codec", CODECS)
def test_text_shrinks(codec: Codec) -> None:
    assert len(compress(codec, TEXT)) < len(TEXT) // 4


def test_parse_codec_names() -> None:
    assert [parse_codec(n) for n in ("none", "GZIP", " snappy", "lz4", "Zstd")] == list(Codec)
    with pytest.raises(InvalidArgument, match="unknown compression 'brotli'"):
        parse_codec("brotli")


@pytest.mark.parametrize("codec", CODECS)
def test_wrong_size_is_refused(codec: Codec) -> None:
    data = compress(codec, TEXT)
    for size in (len(TEXT) - 1, len(TEXT) + 1, 0):
        with pytest.raises(CompressionError):
            decompress(codec, data, size)


@pytest.mark.parametrize("codec", CODECS)
def test_corrupt_bytes_are_refused(codec: Codec) -> None:
    data = bytearray(compress(codec, TEXT))
    with pytest.raises(CompressionError):
        decompress(codec, bytes(data[: len(data) // 2]), len(TEXT))  # truncated
    with pytest.raises(CompressionError):
        decompress(codec, os.urandom(200), len(TEXT))  # garbage


@pytest.mark.parametrize("codec", CODECS)
def test_trailing_bytes_are_refused(codec: Codec) -> None:
    data = compress(codec, TEXT)
    for extra in (b"\x00", b"garbage!", data):
        with pytest.raises(CompressionError):
            decompress(codec, data + extra, len(TEXT))


def test_a_zstd_frame_without_its_size_is_refused() -> None:
    import zstandard

    unsized = zstandard.ZstdCompressor(write_content_size=False).compress(TEXT)
    with pytest.raises(CompressionError, match="states no size"):
        decompress(Codec.ZSTD, unsized, len(TEXT))


@pytest.mark.parametrize("codec", CODECS)
def test_a_bomb_expands_no_further_than_its_declared_size(codec: Codec) -> None:
    bomb = compress(codec, bytes(10_000_000))
    with pytest.raises(CompressionError):
        decompress(codec, bomb, 100)


def test_none_checks_the_size() -> None:
    assert decompress(Codec.NONE, b"abc", 3) == b"abc"
    with pytest.raises(CompressionError):
        decompress(Codec.NONE, b"abc", 4)


@pytest.mark.parametrize("codec", CODECS)
def test_envelope_round_trip(codec: Codec) -> None:
    record = encode_message(StoredMessage(payload=TEXT, publish_time=1, producer_id=2, producer_name="p"))
    stored = wrap(codec, record)
    assert stored[0] == MARK and envelope(stored) == (codec, len(record))
    assert len(stored) < len(record)
    assert unwrap(stored) == record and plain(stored) == record
    assert decode_message(stored).payload == TEXT  # readers decode either form


def test_plain_records_pass_through_uncopied() -> None:
    record = encode_message(StoredMessage(payload=b"v", publish_time=1, producer_id=2, producer_name="p"))
    assert plain(record) is record
    assert wrap(Codec.NONE, record) == record


def test_bad_envelopes() -> None:
    record = encode_message(StoredMessage(payload=TEXT, publish_time=1, producer_id=2, producer_name="p"))
    body = compress(Codec.ZSTD, record)
    with pytest.raises(CompressionError, match="unknown codec id 9"):
        unwrap(ENVELOPE.pack(MARK, 9, len(record)) + body)
    with pytest.raises(CompressionError, match="must name a codec"):
        unwrap(ENVELOPE.pack(MARK, 0, len(record)) + record)
    with pytest.raises(CompressionError, match="exceeds the limit"):
        unwrap(ENVELOPE.pack(MARK, Codec.ZSTD, len(record)) + body, limit=10)
    with pytest.raises(CompressionError, match="not a compressed record"):
        envelope(bytes([MARK, 4]))
    with pytest.raises(CompressionError):
        unwrap(ENVELOPE.pack(MARK, Codec.LZ4, len(record)) + body)  # zstd bytes named lz4
    assert ENVELOPE_SIZE == 6
