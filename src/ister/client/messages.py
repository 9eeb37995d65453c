"""Received messages and the decoding of MessageBatch frames.

A MessageBatch carries WAL frames (offset u64, length u32, crc32c u32, record; see `ister.core.frames`).
Offsets within one batch need not be contiguous (shared subscriptions, redeliveries), so the buffer is
walked with the frame codec run by run: a "gap" stop just starts the next run. Every record's CRC-32C is
verified and the record decoded with msgspec into a `StoredMessage`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

from ister.core.frames import scan_frames
from ister.core.record import StoredMessage
from ister.errors import CorruptionError

if TYPE_CHECKING:
    from ister.client.subscriber import Subscriber

_decode: Callable[[memoryview], StoredMessage] = msgspec.msgpack.Decoder(StoredMessage).decode


class Message:
    """One received message. `offset` is its offset in `topic` (a partition topic for partitioned topics).

    `redelivered` is True when this consumer already received an offset at least this high on this partition
    (a redelivery after a nack, an ack timeout or a reconnect); it can miss redeliveries of messages first
    delivered to another consumer of a shared subscription.
    """

    __slots__ = ("_record", "_sub", "offset", "redelivered")

    def __init__(self, offset: int, record: StoredMessage, sub: Subscriber, redelivered: bool) -> None:
        self.offset = offset
        self._record = record
        self._sub = sub
        self.redelivered = redelivered

    @property
    def topic(self) -> str:
        return self._sub.topic

    @property
    def payload(self) -> bytes:
        return self._record.payload

    @property
    def attributes(self) -> dict[str, str]:
        return self._record.attributes

    @property
    def key(self) -> str | None:
        """The routing key the producer gave, or None."""
        return self._record.routing_key

    @property
    def publish_time(self) -> int:
        """Unix milliseconds, as set by the producer."""
        return self._record.publish_time

    @property
    def producer_name(self) -> str:
        return self._record.producer_name

    @property
    def producer_id(self) -> int:
        return self._record.producer_id

    @property
    def schema_id(self) -> int | None:
        return self._record.schema_id

    @property
    def schema_version(self) -> int | None:
        return self._record.schema_version

    @property
    def record(self) -> StoredMessage:
        return self._record

    async def ack(self) -> None:
        """Acknowledge. Acks are coalesced into offset ranges and sent in the background within a few ms;
        this only waits when the bounded buffer of unsent acks is full (e.g. while reconnecting)."""
        await self._sub.ack(self.offset)

    def ack_nowait(self) -> None:
        """Acknowledge without waiting (the ack buffer may grow past its bound by this one offset)."""
        self._sub.ack_nowait(self.offset)

    async def nack(self, delay_ms: int | None = None, reason: str | None = None) -> None:
        """Negative acknowledgement: the broker redelivers after `delay_ms` (or its backoff policy)."""
        await self._sub.nack([self.offset], delay_ms, reason)

    def __repr__(self) -> str:
        return (
            f"Message(topic={self.topic!r}, offset={self.offset}, payload={self.payload[:32]!r}, "
            f"key={self.key!r}, redelivered={self.redelivered})"
        )


def decode_batch(frames: bytes, count: int, sub: Subscriber, max_seen: int) -> tuple[list[Message], int]:
    """The messages of one MessageBatch and the new highest offset seen; CorruptionError on a bad frame."""
    mv = memoryview(frames)
    out: list[Message] = []
    append = out.append
    pos = 0
    n = len(mv)
    while pos < n:
        result = scan_frames(mv[pos:])
        for offset, payload, _ in result.frames:
            try:
                record = _decode(payload)
            except msgspec.DecodeError as exc:
                raise CorruptionError(f"undecodable record at offset {offset}: {exc}") from None
            append(Message(offset, record, sub, offset <= max_seen))
            if offset > max_seen:
                max_seen = offset
        pos += result.safe_length
        if result.stop == "end":
            break
        if result.stop != "gap" or result.safe_length == 0:
            raise CorruptionError(f"bad frame in a message batch at byte {pos}: {result.stop}")
    if len(out) != count:
        raise CorruptionError(f"message batch declares {count} messages but holds {len(out)}")
    return out, max_seen


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
