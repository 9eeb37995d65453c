"""Producer and consumer sessions: the broker-side identity of a client and its outbound stream."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from ister.core.dispatch import SubType
from ister.core.record import StoredMessage


@dataclass(slots=True)
class ProducerSession:
    id: int
    name: str
    topic: str
    access_mode: int


@dataclass(frozen=True, slots=True)
class Outbound:
    """One message on its way to a consumer's stream."""

    offset: int
    message: StoredMessage
    record: bytes  # the message as stored (msgpack), for the batch API's frames
    redelivery: bool = False


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
