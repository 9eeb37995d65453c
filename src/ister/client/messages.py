"""Received messages and the decoding of MessageBatch frames.

A MessageBatch carries WAL frames (offset u64, length u32, crc32c u32, record; see `ister.core.frames`).
Offsets within one batch need not be contiguous (shared subscriptions, redeliveries), so the frames are
walked with the codec's header layout rather than `scan_frames` (which stops at a gap). Every record's
CRC-32C is verified and the records decoded with msgspec into `StoredMessage`s.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import accumulate, repeat
from typing import TYPE_CHECKING

import msgspec
from crc32c import crc32c

from ister.core.compression import MARK, CompressionError, MissingDictionary, unwrap
from ister.core.frames import HEADER, HEADER_SIZE, MAX_FRAME_PAYLOAD
from ister.core.record import StoredMessage, array_header
from ister.errors import CorruptionError

if TYPE_CHECKING:
    from ister.client.subscriber import Subscriber

_decode_all = msgspec.msgpack.Decoder(list[StoredMessage]).decode


class Message(msgspec.Struct):
    """One received message. `offset` is its offset in `topic` (a partition topic for partitioned topics).

    `redelivered` is True when this consumer already received an offset at least this high on this partition
    (a redelivery after a nack, an ack timeout or a reconnect); it can miss redeliveries of messages first
    delivered to another consumer of a shared subscription.
    """

    offset: int
    record: StoredMessage
    _sub: Subscriber
    redelivered: bool = False
    epoch: int = 0  # the subscription's cursor epoch of the stream that delivered it

    @property
    def stale(self) -> bool:
        """Delivered before the subscription's cursor was reset: acking it changes nothing."""
        return self.epoch != self._sub.epoch

    @property
    def topic(self) -> str:
        return self._sub.topic

    @property
    def payload(self) -> bytes:
        return self.record.payload

    @property
    def attributes(self) -> dict[str, str]:
        return self.record.attributes

    @property
    def key(self) -> str | None:
        """The routing key the producer gave, or None."""
        return self.record.routing_key

    @property
    def publish_time(self) -> int:
        """Unix milliseconds, as set by the producer."""
        return self.record.publish_time

    @property
    def producer_name(self) -> str:
        return self.record.producer_name

    @property
    def producer_id(self) -> int:
        return self.record.producer_id

    @property
    def schema_id(self) -> int | None:
        return self.record.schema_id

    @property
    def schema_version(self) -> int | None:
        return self.record.schema_version

    async def ack(self) -> None:
        """Acknowledge. Acks are coalesced into offset ranges and sent in the background within a few ms;
        this only waits when the bounded buffer of unsent acks is full (e.g. while reconnecting)."""
        if self.epoch == self._sub.epoch:
            await self._sub.ack(self.offset)

    def ack_nowait(self) -> None:
        """Acknowledge without waiting (the ack buffer may grow past its bound by this one offset)."""
        if self.epoch == self._sub.epoch:
            self._sub.ack_nowait(self.offset)

    async def nack(self, delay_ms: int | None = None, reason: str | None = None) -> None:
        """Negative acknowledgement: the broker redelivers after `delay_ms` (or its backoff policy)."""
        if self.epoch == self._sub.epoch:
            await self._sub.nack([self.offset], delay_ms, reason)

    def __repr__(self) -> str:
        return (
            f"Message(topic={self.topic!r}, offset={self.offset}, payload={self.payload[:32]!r}, "
            f"key={self.key!r}, redelivered={self.redelivered})"
        )


def split_frames(frames: bytes, count: int) -> tuple[list[int], list[memoryview]]:
    """Offsets and record views of one MessageBatch, every record's CRC-32C checked (CorruptionError on a
    torn or bad frame, or when the batch does not hold `count` frames); compressed records decompressed
    (MissingDictionary for a zstd dictionary this process has not loaded yet)."""
    mv = memoryview(frames)
    n = len(mv)
    unpack = HEADER.unpack_from
    offsets: list[int] = []
    records: list[memoryview] = []
    add_offset, add_record = offsets.append, records.append
    pos = 0
    while pos < n:
        if pos + HEADER_SIZE > n:
            raise CorruptionError(f"torn frame header in a message batch at byte {pos}")
        offset, length, crc = unpack(mv, pos)
        start = pos + HEADER_SIZE
        pos = start + length
        if pos > n or length > MAX_FRAME_PAYLOAD:
            raise CorruptionError(f"torn frame in a message batch at offset {offset}")
        record = mv[start:pos]
        if crc32c(record) != crc:
            raise CorruptionError(f"CRC mismatch in a message batch at offset {offset}")
        if length and record[0] == MARK:  # stored compressed: the broker sends it as stored
            record = _plain(record, offset)
        add_offset(offset)
        add_record(record)
    if len(offsets) != count:
        raise CorruptionError(f"message batch declares {count} messages but holds {len(offsets)}")
    return offsets, records


def _plain(record: memoryview, offset: int) -> memoryview:
    try:
        return memoryview(unwrap(record))
    except MissingDictionary:
        raise  # fetched from the broker, then the batch is decoded again (client/dictionaries.py)
    except CompressionError as exc:
        raise CorruptionError(f"compressed record at offset {offset} does not decompress: {exc}") from None


def decode_batch(frames: bytes, count: int, sub: Subscriber, max_seen: int) -> tuple[list[Message], int]:
    """The messages of one MessageBatch and the new highest offset seen; CorruptionError on a bad frame.

    Frames are walked with the codec's header layout, every record's CRC-32C is checked, then all records
    are decoded in one msgspec call (as one msgpack array) and wrapped in one C-level map."""
    offsets, records = split_frames(frames, count)
    if not offsets:
        return [], max_seen
    try:
        decoded = _decode_all(array_header(len(records)) + b"".join(records))
    except msgspec.DecodeError as exc:
        raise CorruptionError(f"undecodable record in a message batch: {exc}") from None
    if offsets[0] > max_seen and all(map(int.__lt__, offsets, offsets[1:])):
        flags: Iterable[bool] = repeat(False)  # the common case: all new, ascending
        top = offsets[-1]
    else:
        flags = [o <= m for o, m in zip(offsets, accumulate(offsets, max, initial=max_seen), strict=False)]
        top = max(max_seen, *offsets)
    return list(map(Message, offsets, decoded, repeat(sub), flags, repeat(sub.epoch))), top


def offset_ranges(offsets: list[int]) -> list[tuple[int, int]]:
    """Sorted, merged inclusive ranges of `offsets` (duplicates allowed)."""
    if not offsets:
        return []
    offsets.sort()
    ranges: list[tuple[int, int]] = []
    first = last = offsets[0]
    for o in offsets:
        if o > last + 1:
            ranges.append((first, last))
            first = o
        if o > last:
            last = o
    ranges.append((first, last))
    return ranges
