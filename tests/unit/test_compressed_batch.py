"""Compressed batches and records beyond the codecs (docs/compression.md): a producer's compressed
PublishBatch checked and unpacked, idempotence tags and publish times inside compressed records, plain
frames for consumers that do not accept compressed ones, the broker's policy compression."""

from __future__ import annotations

import msgspec
import pytest
from crc32c import crc32c

from ister.broker.compression_policy import compress_plain, compression_in_effect
from ister.core.compressed_batch import compress_batch, decompress_batch
from ister.core.compression import ENVELOPE, MARK, Codec, CompressionError, envelope, unwrap, wrap
from ister.core.frames import HEADER, encode_frames
from ister.core.publish_time import frames_time_span
from ister.core.publish_time import publish_time_of as fast_publish_time
from ister.core.record import (
    StoredMessage,
    array_header,
    decode_message,
    encode_message,
    idem_tag_of,
    publish_time_of,
    tag_record,
)
from ister.errors import CorruptionError, InvalidArgument
from ister.metadata.records import NamespacePolicy, TopicCompression
from ister.server.ister_compressed import plain_frames

LIMIT = 1 << 20


def records(n: int, t0: int = 1_000) -> list[bytes]:
    return [encode_message(StoredMessage(b"payload %d " % i * 20, t0 + i, 7, "p")) for i in range(n)]


def plain_array(recs: list[bytes]) -> bytes:
    return array_header(len(recs)) + b"".join(recs)


@pytest.mark.parametrize("codec", [Codec.LZ4, Codec.ZSTD, Codec.SNAPPY, Codec.GZIP])
def test_a_compressed_batch_unpacks_to_its_plain_records(codec: Codec) -> None:
    recs = records(20)
    data, size = compress_batch(codec, plain_array(recs))
    assert size == len(plain_array(recs)) and len(data) < size
    plain, stored = decompress_batch(codec, data, 20, size, LIMIT)
    assert plain == plain_array(recs)
    assert [unwrap(s) for s in stored] == recs and all(envelope(s)[0] is codec for s in stored)


def test_bad_batches_are_refused_before_anything_is_decompressed() -> None:
    recs = records(3)
    data, size = compress_batch(Codec.ZSTD, plain_array(recs))
    with pytest.raises(CompressionError, match="unknown codec id 7"):
        decompress_batch(7, data, 3, size, LIMIT)
    with pytest.raises(CompressionError, match="codec 0"):
        decompress_batch(0, data, 3, size, LIMIT)
    with pytest.raises(CompressionError, match="exceeds"):
        decompress_batch(Codec.ZSTD, data, 3, size, size - 1)
    with pytest.raises(InvalidArgument, match="3 records, count says 4"):
        decompress_batch(Codec.ZSTD, data, 4, size, LIMIT)
    with pytest.raises(CompressionError, match="add up to"):
        decompress_batch(Codec.ZSTD, data, 3, size + 1, LIMIT)
    with pytest.raises(CompressionError, match="not a record compressed with codec 3"):
        decompress_batch(Codec.LZ4, data, 3, size, LIMIT)
    with pytest.raises(InvalidArgument, match="msgpack array of bin"):
        decompress_batch(Codec.ZSTD, b"\xc1garbage", 3, size, LIMIT)
    short = msgspec.msgpack.encode([b"\xc1\x04"])
    with pytest.raises(CompressionError, match="shorter than its envelope"):
        decompress_batch(Codec.ZSTD, short, 1, 10, LIMIT)
    stored = msgspec.msgpack.decode(data)
    stored[2] = stored[2][:-3]  # a truncated zstd frame
    with pytest.raises(CompressionError, match="record 2"):
        decompress_batch(Codec.ZSTD, msgspec.msgpack.encode(stored), 3, size, LIMIT)


@pytest.mark.parametrize("codec", [Codec.LZ4, Codec.GZIP])
def test_a_compressed_record_is_tagged_inside_and_keeps_its_codec(codec: Codec) -> None:
    rec = records(1)[0]
    tagged = tag_record(wrap(codec, rec), 99, 5, 3)
    assert tagged[0] == MARK and envelope(tagged)[0] is codec
    assert idem_tag_of(tagged) == (99, 5, 3)
    assert decode_message(tagged) == decode_message(rec)


def test_publish_times_of_compressed_records() -> None:
    recs = records(4, t0=5_000)
    stored = [wrap(Codec.SNAPPY, r) for r in recs]
    assert [fast_publish_time(s) for s in stored] == [5_000, 5_001, 5_002, 5_003]
    assert publish_time_of(stored[1]) == 5_001
    assert frames_time_span(encode_frames(0, [stored[2], recs[0], stored[3]])) == (5_000, 5_003)
    broken = stored[0][: ENVELOPE.size] + b"\x00" * 10
    assert fast_publish_time(broken) is None and publish_time_of(broken) is None
    with pytest.raises(msgspec.DecodeError):
        decode_message(broken)


def test_plain_frames_for_a_consumer_that_does_not_accept_compressed_records() -> None:
    recs = records(3)
    frames = encode_frames(10, [wrap(Codec.ZSTD, recs[0]), recs[1], wrap(Codec.LZ4, recs[2])])
    out = bytes(plain_frames(frames))
    assert out == encode_frames(10, recs)
    plain = encode_frames(10, recs)
    assert plain_frames(plain) is plain  # nothing compressed: the same object, no copy
    bad = wrap(Codec.ZSTD, recs[0])[: ENVELOPE.size] + b"junk"
    framed = HEADER.pack(0, len(bad), crc32c(bad)) + bad
    with pytest.raises(CorruptionError):
        plain_frames(framed)


def test_the_policy_compresses_plain_records_and_keeps_a_producers_own() -> None:
    recs = records(2)
    own = wrap(Codec.LZ4, recs[1])
    out = compress_plain(Codec.GZIP, [recs[0], msgspec.Raw(own)])
    assert envelope(out[0])[0] is Codec.GZIP and unwrap(out[0]) == recs[0]
    assert bytes(out[1]) == own


def test_policies_in_effect_and_lenient_reads() -> None:
    assert compression_in_effect(NamespacePolicy(), None) == ("none", "default")
    ns = NamespacePolicy.lenient({"compression": "zstd", "max_publish_rate": 5})
    assert ns.compression == "zstd" and ns.max_publish_rate == 5
    assert compression_in_effect(ns, None) == ("zstd", "namespace")
    assert compression_in_effect(ns, TopicCompression(compression="lz4")) == ("lz4", "topic")
    assert NamespacePolicy.lenient({"compression": "brotli"}).compression is None
    assert TopicCompression.lenient({"compression": 3}) is None
