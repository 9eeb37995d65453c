"""Producer and consumer sessions: the broker-side identity of a client and its outbound stream."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import msgspec

from ister.core.dispatch import SubType
from ister.core.record import StoredMessage, decode_message

Record = bytes | msgspec.Raw  # a stored record; Raw when it is a slice of a client's batch


@dataclass(slots=True)
class ProducerSession:
    id: int
    name: str
    topic: str
    access_mode: int


class Outbound:
    """One message on its way to a consumer's stream: its offset and its record as stored (msgpack).

    The batch API forwards the record untouched; the Danube API decodes it (`message`) when it sends it.
    """

    __slots__ = ("_message", "offset", "record", "redelivery")

    def __init__(
        self, offset: int, record: Record, redelivery: bool = False, message: StoredMessage | None = None
    ) -> None:
        self.offset = offset
        self.record = record
        self.redelivery = redelivery
        self._message = message

    @property
    def message(self) -> StoredMessage:
        if self._message is None:
            self._message = decode_message(self.record)
        return self._message


class ConsumerStream:
    """The queue behind one ReceiveMessages call. A None item ends the stream (takeover or shutdown)."""

    def __init__(self, maxsize: int) -> None:
        self.queue: asyncio.Queue[Outbound | None] = asyncio.Queue(maxsize)
        self.closed = False

    def offer(self, item: Outbound) -> bool:
        """Non-blocking enqueue; False when the bounded buffer is full or the stream ended."""
        if self.closed:
            return False
        try:
            self.queue.put_nowait(item)
        except asyncio.QueueFull:
            return False
        return True

    def end(self) -> None:
        if self.closed:
            return
        self.closed = True
        while not self.queue.empty():
            self.queue.get_nowait()
        self.queue.put_nowait(None)


@dataclass(slots=True)
class ConsumerSession:
    id: int
    name: str
    topic: str
    subscription: str
    sub_type: SubType
    key_filters: tuple[str, ...]
    stream: ConsumerStream | None = None
    last_seen: float = field(default_factory=time.monotonic)

    @property
    def attached(self) -> bool:
        return self.stream is not None and not self.stream.closed

    def touch(self) -> None:
        self.last_seen = time.monotonic()
