"""Encoding the `records` of a PublishBatch without building one object per message.

The layout (ister_v1.proto, `ister.core.record.StoredMessage`) is a msgpack array of records, each the
8-element array [payload, publish_time_ms, producer_id, producer_name, attributes, routing_key,
schema_id, schema_version]. Messages sent together share everything but the payload, so a batch is kept
as segments `(payloads, publish_time, attributes, key)`: each record is then `fixarray(8) + bin header`,
the payload and a tail common to the segment, joined in C. The producer id is applied at encode time, so
re-sending after a reconnect that changed it costs one re-encode and nothing else. `Batch` is one such
group of segments on its way to the broker, with the futures waiting for its acknowledgement.
"""

from __future__ import annotations

import asyncio
import secrets
from itertools import chain, repeat
from typing import Any

import msgspec

from ister.core.compressed_batch import compress_batch
from ister.core.compression import Codec
from ister.core.record import array_header

_encode = msgspec.msgpack.Encoder().encode

Payload = bytes | bytearray | memoryview
# One run of messages sharing publish time, attributes and key: [payloads, publish_time, attributes, key].
Segment = list[Any]


class _Prefixes(dict[int, bytes]):
    """fixarray(8) + msgpack bin header for a payload length (memoised for common lengths)."""

    def __missing__(self, n: int) -> bytes:
        if n < 0x100:
            v = b"\x98\xc4" + n.to_bytes(1, "big")
        elif n < 0x10000:
            v = b"\x98\xc5" + n.to_bytes(2, "big")
        else:
            v = b"\x98\xc6" + n.to_bytes(4, "big")
        if len(self) < 8192:
            self[n] = v
        return v


_PREFIX = _Prefixes()
RECORD_OVERHEAD = 54  # msgpack bytes of one record besides payload, producer name, attributes and key
# (schema id and version included: up to 9 + 5 bytes)


def encode_records(
    segments: list[Segment],
    count: int,
    producer_id: int,
    producer_name: str,
    schema: tuple[int | None, int | None] = (None, None),
) -> bytes:
    """The msgpack array of `count` records held in `segments`, stamped with `schema` (id, version)."""
    sid, sv = schema
    parts = [array_header(count)]
    prefix = _PREFIX.__getitem__
    for payloads, ts, attributes, key in segments:
        if len(payloads) == 1:  # one message with its own attributes (send_each): one record, one call
            parts.append(_encode((payloads[0], ts, producer_id, producer_name, attributes, key, sid, sv)))
            continue
        # The 7 fields after the payload, without their own array header (1 byte for 7 elements).
        tail = _encode((ts, producer_id, producer_name, attributes, key, sid, sv))[1:]
        parts.append(
            b"".join(chain.from_iterable(zip(map(prefix, map(len, payloads)), payloads, repeat(tail))))
        )
    return b"".join(parts)


def new_producer_key() -> int:
    """An idempotent producer's key: random, non-zero, 64 bits (0 on the wire means "not idempotent")."""
    return secrets.randbits(64) or 1


def attributes_size(attributes: dict[str, str] | None, key: str | None) -> int:
    n = 0
    if attributes:
        for k, v in attributes.items():
            n += len(k.encode()) + len(v.encode()) + 10
    if key is not None:
        n += len(key.encode()) + 5
    return n


class Batch:
    """Messages sealed together; `done` resolves to the first offset (or fails) when the broker answers."""

    __slots__ = (
        "count",
        "done",
        "first_seq",
        "futs",
        "nbytes",
        "plain_size",
        "records",
        "records_dict",
        "records_pid",
        "segs",
        "seq",
    )

    def __init__(self, seq: int, loop: asyncio.AbstractEventLoop) -> None:
        self.seq = seq
        self.segs: list[Segment] = []
        self.count = 0
        self.nbytes = 0
        self.futs: list[tuple[int, asyncio.Future[int]]] | None = None
        self.done: asyncio.Future[int] = loop.create_future()
        self.records: bytes | None = None
        self.records_pid = -1
        self.records_dict = 0  # the zstd dictionary `records` were compressed with
        self.plain_size = 0  # compressed records: the size of their plain msgpack array (0: plain)
        self.first_seq = -1  # idempotence: its first message's sequence, drawn when first sent

    def encode(
        self,
        producer_id: int,
        producer_name: str,
        schema: tuple[int | None, int | None] = (None, None),
        codec: Codec = Codec.NONE,
        dict_id: int = 0,
    ) -> bytes:
        """The batch's `records` (compressed with `codec`, and zstd dictionary `dict_id` when not 0: see
        `plain_size`), encoded once per producer id and dictionary (a broker reached after a reconnect may
        name another, or none: a re-sent batch is compressed again for it)."""
        if self.records is None or self.records_pid != producer_id or self.records_dict != dict_id:
            records = encode_records(self.segs, self.count, producer_id, producer_name, schema)
            if codec is not Codec.NONE:
                records, self.plain_size = compress_batch(codec, records, dict_id)
            self.records = records
            self.records_pid = producer_id
            self.records_dict = dict_id
        return self.records

    def resolve(self, first: int) -> None:
        if self.futs:
            for i, fut in self.futs:
                if not fut.done():
                    fut.set_result(first + i)
        if not self.done.done():
            self.done.set_result(first)
        self.segs = []
        self.records = None

    def fail(self, err: BaseException) -> None:
        if self.futs:
            for _, fut in self.futs:
                if not fut.done():
                    fut.set_exception(err)
        if not self.done.done():
            self.done.set_exception(err)
            self.done.exception()  # retrieved: nobody may be waiting for this batch
        self.segs = []
        self.records = None
