"""Compressed records on the batch API (docs/compression.md): a producer's compressed batch in, plain
records out to consumers that did not ask for compressed ones (older clients), records compressed with a
zstd dictionary plain to consumers that did not ask for those (`accept_dictionaries`: clients before
GetCompressionDictionary existed), and that RPC's answer."""

from __future__ import annotations

from typing import Any

from crc32c import crc32c

from ister.core.compressed_batch import decompress_batch
from ister.core.compression import MARK, Buffer, CompressionError, plain, uses_dictionary
from ister.core.frames import HEADER, HEADER_SIZE
from ister.core.zdict import REGISTRY, DictionaryRegistry
from ister.errors import CorruptionError, InvalidArgument, NotFound
from ister.ids import TopicName
from ister.metadata import keys
from ister.metadata.cache import LocalCache
from ister.wire.gen import ister_v1_pb2 as pb


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


def client_record(record: Buffer, accept: bool, dicts: bool = False) -> Buffer:
    """A stored record as a consumer gets it: as stored when it accepts compressed records and either
    accepts dictionaries (`dicts`) or the record needs none; plain otherwise."""
    if accept and (dicts or not uses_dictionary(record)):
        return record
    return plain_record(record)


def client_frames(frames: bytes | memoryview, accept: bool, dicts: bool = False) -> bytes | memoryview:
    """`plain_frames` for a consumer: none when it accepts compressed records and dictionaries (the frames
    as they are, nothing scanned), only the records with a dictionary when it accepts compressed ones."""
    if accept and dicts:
        return frames
    return plain_frames(frames, only_dictionary=accept)


def dictionary_namespace(value: Any) -> str | None:
    """The namespace a stored dictionary was trained for (`/ister/compression-dicts/{id}`'s `topic`, a
    topic `/ns/name` or a namespace); None when the value does not say."""
    scope = value.get("topic") if isinstance(value, dict) else None
    if not isinstance(scope, str) or not scope.strip("/"):
        return None
    return scope.strip("/").split("/", 1)[0]


def get_dictionary(
    request: Any, cache: LocalCache, registry: DictionaryRegistry = REGISTRY
) -> pb.GetCompressionDictionaryResponse:
    """GetCompressionDictionary: the dictionary from this broker's registry, when it was trained for a topic
    of the requested topic's namespace (a dictionary holds samples of its topic's records: a client with
    rights on one namespace does not read another's). NotFound otherwise, the same answer for an unknown
    id and another namespace's, so ids cannot be probed."""
    name = TopicName.parse(request.topic)
    dict_id = int(request.id)
    data = registry.get(dict_id)
    kv = cache.get(keys.compression_dict(dict_id)) if data is not None else None
    if data is None or kv is None or dictionary_namespace(kv.value) != name.namespace:
        raise NotFound(f"no zstd dictionary {dict_id} for namespace {name.namespace} on this broker")
    return pb.GetCompressionDictionaryResponse(id=dict_id, dictionary=data)


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
