"""Producer and consumer sessions: the broker-side identity of a client and its outbound stream."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import msgspec

from ister.clock import REAL_CLOCK, Clock
from ister.core.dispatch import SubType
from ister.core.frameblock import FrameBlock
from ister.core.frames import HEADER_SIZE
from ister.core.record import StoredMessage, decode_message
from ister.limits import MiB

Record = bytes | msgspec.Raw  # a stored record; Raw when it is a slice of a client's batch

CHUNK_MAX_MESSAGES = 4096  # what one batch-API MessageBatch carries at most
CHUNK_MAX_BYTES = 1 * MiB  # ... and its frames' bytes (one message may exceed it)


@dataclass(slots=True)
class ProducerSession:
    id: int
    name: str
    topic: str
    access_mode: int
    # Liveness, for forgetting producers whose client is gone (`Producers.reap`): open batch-API Publish
    # streams, and when the producer last sent, health-checked or closed a stream (monotonic seconds).
    attached: int = 0
    last_seen: float = field(init=False)
    # For the admin API's stats (docs/admin.md): the client's address, when it connected (Unix seconds),
    # and what it sent (messages, payload bytes) since it was created on this broker.
    address: str = ""
    connected_at: float = field(init=False)
    messages: int = 0
    bytes: int = 0
    clock: Clock = field(default=REAL_CLOCK, repr=False, compare=False)  # the broker's

    def __post_init__(self) -> None:
        self.last_seen = self.clock.monotonic()
        self.connected_at = self.clock.time()

    def touch(self) -> None:
        self.last_seen = self.clock.monotonic()

    def connected(self, address: str) -> None:
        """A client (re)connected this producer: a CreateProducer call or a batch-API Publish stream."""
        self.address = address
        self.connected_at = self.clock.time()

    def sent(self, messages: int, nbytes: int) -> None:
        self.messages += messages
        self.bytes += nbytes


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


class OutChunk:
    """Messages on their way to one consumer's stream as one piece: consecutive frames as they were read
    (`block`, sent by the batch API as they are), or records of any offsets (`records`, framed when sent).

    At most `CHUNK_MAX_MESSAGES` messages and about `CHUNK_MAX_BYTES` of frames (one record may exceed it),
    so a chunk always fits one MessageBatch.
    """

    __slots__ = ("block", "count", "nbytes", "offsets", "records", "redelivery")

    def __init__(
        self,
        offsets: Sequence[int],
        *,
        block: FrameBlock | None = None,
        records: Sequence[Record] | None = None,
        redelivery: bool = False,
    ) -> None:
        self.offsets = offsets
        self.block = block
        self.records = records
        self.redelivery = redelivery
        self.count = len(offsets)
        if block is not None:
            self.nbytes = block.nbytes
        else:
            assert records is not None
            self.nbytes = sum(map(len, records)) + HEADER_SIZE * self.count

    def outbounds(self) -> Iterator[Outbound]:
        """One `Outbound` per message (the Danube API sends them one by one)."""
        records: Iterable[Record] = self.records if self.records is not None else _payloads(self.block)
        for offset, record in zip(self.offsets, records, strict=True):
            yield Outbound(offset, record, self.redelivery)


def _payloads(block: FrameBlock | None) -> Iterator[bytes]:
    assert block is not None
    for offset in range(block.first, block.end):
        yield block.record(offset)


Item = Outbound | OutChunk


class ConsumerStream:
    """The buffer behind one ReceiveMessages / Consume call: single messages (`offer`) or chunks of them
    (`offer_chunk`), bounded by `maxsize` messages. Ended by `end` (takeover, shutdown); then `get` gives
    None."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self.items: deque[Item] = deque()
        self.pending = 0  # messages in `items`
        self.closed = False
        self._waiter: asyncio.Future[None] | None = None

    def offer(self, item: Outbound) -> bool:
        """Non-blocking enqueue; False when the bounded buffer is full or the stream ended."""
        if self.closed or self.pending >= self.maxsize:
            return False
        self._push(item, 1)
        return True

    def offer_chunk(self, chunk: OutChunk) -> bool:
        """Enqueue a chunk whole; False when its messages do not fit the buffer or the stream ended."""
        if self.closed or self.pending + chunk.count > self.maxsize:
            return False
        self._push(chunk, chunk.count)
        return True

    def _push(self, item: Item, n: int) -> None:
        self.items.append(item)
        self.pending += n
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def empty(self) -> bool:
        return not self.items

    async def get(self) -> Item | None:
        """The next item, waiting for one; None once the stream ended."""
        while not self.items:
            if self.closed:
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self.pop()

    def peek(self) -> Item | None:
        return self.items[0] if self.items else None

    def pop(self) -> Item:
        item = self.items.popleft()
        self.pending -= item.count if isinstance(item, OutChunk) else 1
        return item

    def end(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.items.clear()
        self.pending = 0
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


@dataclass(slots=True)
class ConsumerSession:
    id: int
    name: str
    topic: str
    subscription: str
    sub_type: SubType
    key_filters: tuple[str, ...]
    stream: ConsumerStream | None = None
    last_seen: float = field(init=False)  # monotonic seconds: a health check, its stream opening or ending
    address: str = ""  # the client's address as gRPC saw it on its delivery stream (admin stats)
    connected_at: float = 0.0  # Unix seconds its delivery stream opened
    clock: Clock = field(default=REAL_CLOCK, repr=False, compare=False)  # the broker's

    def __post_init__(self) -> None:
        self.last_seen = self.clock.monotonic()

    @property
    def attached(self) -> bool:
        return self.stream is not None and not self.stream.closed

    def touch(self) -> None:
        self.last_seen = self.clock.monotonic()

    def idle_seconds(self) -> float:
        """Seconds since it was last seen."""
        return self.clock.monotonic() - self.last_seen
