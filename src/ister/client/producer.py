"""The producer: send one message, many, or fire-and-forget, with batching, routing and a bounded buffer.

Delivery: `send()` returns (and a `send_nowait()` future resolves to) the message's offset only once the
broker has acknowledged its batch, which for a reliable topic means the batch is on disk (fsync). Messages
of one producer to one partition are stored in send order. On a connection failure unacknowledged batches
are re-sent after reconnecting; the producer is idempotent by default, so a batch whose ack was lost is
stored once and answered with its original offsets (docs/idempotence.md). With `idempotent=False` such a
batch may be stored twice (at-least-once); see `ister.client.publisher`.

Buffer: at most `max_buffered_messages` / `max_buffered_bytes` may be unacknowledged at once. `send()`,
`send_batch()` and `send_each()` wait for room; `send_nowait()` raises ResourceExhausted when the buffer is
full.

Partitioned topics: unkeyed messages go round-robin, one batch per partition at a time; keyed messages go
to partition FNV-1a(key) % n, as with the Danube clients, so a key's messages stay in order on one
partition. Offsets are per partition.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from ister import errors
from ister.client.publisher import PartitionPublisher
from ister.client.records import Batch, Payload, attributes_size
from ister.client.routing import Router
from ister.core.record import check_attributes, check_routing_key

if TYPE_CHECKING:
    from ister.client.client import Client
    from ister.client.schemas import SchemaVersion

_BYTES_TYPES = frozenset({bytes, bytearray, memoryview})
_NO_ATTRS: dict[str, str] = {}
Outgoing = tuple[Payload, dict[str, str] | None, str | None]  # (payload, attributes, routing key)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _check_message(attributes: dict[str, str] | None, key: str | None) -> None:
    """The broker's own checks (`ister.core.record`), so that one bad message fails alone, not its batch."""
    if attributes:
        check_attributes(attributes)
    check_routing_key(key)


class Producer:
    """Publishes to one topic (all partitions of a partitioned topic). Create with `Client.producer()`."""

    def __init__(
        self,
        client: Client,
        topic: str,
        name: str,
        *,
        max_batch_bytes: int,
        max_buffered_messages: int,
        max_buffered_bytes: int,
    ) -> None:
        self._client = client
        self.topic = topic
        self.name = name
        self._max_batch_bytes = max_batch_bytes
        self._max_buffered = max_buffered_messages
        self._max_buffered_bytes = max_buffered_bytes
        self._buffered = 0
        self._buffered_bytes = 0
        self._space = asyncio.Event()
        self._pubs: list[PartitionPublisher] = []
        self._router = Router(1)
        self._closed = False
        self._each_order = asyncio.Lock()  # FIFO: concurrent send_each() calls queue in call order
        self.schema: SchemaVersion | None = None  # the schema version stamped on every message, if any

    def _attach(self, publishers: list[PartitionPublisher]) -> None:
        self._pubs = publishers
        self._router = Router(len(publishers))

    def _on_seal(self, index: int) -> None:
        self._router.advance(index)

    def _on_release(self, count: int, nbytes: int) -> None:
        self._buffered -= count
        self._buffered_bytes -= nbytes
        self._space.set()

    @property
    def partitions(self) -> list[str]:
        """The topics this producer publishes to: `[topic]`, or the `-part-N` topics in index order."""
        return [p.topic for p in self._pubs]

    @property
    def buffered(self) -> int:
        """Messages sent but not yet acknowledged."""
        return self._buffered

    # -- sending --------------------------------------------------------------------------------------------
    def _full(self, count: int, nbytes: int) -> bool:
        return self._buffered > 0 and (
            self._buffered + count > self._max_buffered
            or self._buffered_bytes + nbytes > self._max_buffered_bytes
        )

    async def _wait_room(self, count: int, nbytes: int) -> None:
        while self._full(count, nbytes):
            self._space.clear()
            await self._space.wait()
            self._check_open()

    def _check_open(self) -> None:
        if self._closed:
            raise errors.FailedPrecondition(f"producer {self.name!r} on {self.topic} is closed")

    def _prepare(
        self, payload: Payload, attributes: dict[str, str] | None, key: str | None
    ) -> tuple[PartitionPublisher, int]:
        self._check_open()
        if type(payload) not in _BYTES_TYPES:
            raise TypeError(f"payload must be bytes, not {type(payload).__name__}")
        extra = 0
        if attributes or key is not None:
            _check_message(attributes, key)
            extra = attributes_size(attributes, key)
        pub = self._pubs[self._router.current if key is None else self._router.for_key(key)]
        size = len(payload) + pub.overhead + extra
        if size > pub.max_bytes:
            raise errors.InvalidArgument(
                f"message of {len(payload)} bytes exceeds the batch limit of {pub.max_bytes} bytes"
            )
        return pub, size

    async def send(
        self, payload: Payload, attributes: dict[str, str] | None = None, key: str | None = None
    ) -> int:
        """Publish one message; returns its offset once the broker acknowledged it (durable if reliable).

        The message waits up to `linger_ms` for others to share its batch. Raises the typed error when
        its batch is rejected (InvalidArgument, NotFound, ...) or retries are exhausted (Unavailable...)."""
        pub, size = self._prepare(payload, attributes, key)
        if self._full(1, size):
            await self._wait_room(1, size)
            pub, size = self._prepare(payload, attributes, key)  # routing may have moved on meanwhile
        self._buffered += 1
        self._buffered_bytes += size
        # Its own future: cancelling this send() cancels only it (the message stays in its batch).
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        pub.append(payload, size, _now_ms(), attributes or _NO_ATTRS, key, fut)
        return await fut

    def send_nowait(
        self, payload: Payload, attributes: dict[str, str] | None = None, key: str | None = None
    ) -> asyncio.Future[int]:
        """Queue one message without waiting; the future resolves to its offset (or the typed error).

        Raises ResourceExhausted at once when the producer's buffer is full (use `send()` to wait)."""
        pub, size = self._prepare(payload, attributes, key)
        if self._full(1, size):
            raise errors.ResourceExhausted(
                f"producer buffer full ({self._buffered} messages, "
                f"{self._buffered_bytes} bytes unacknowledged)"
            )
        self._buffered += 1
        self._buffered_bytes += size
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        pub.append(payload, size, _now_ms(), attributes or _NO_ATTRS, key, fut)
        return fut

    async def send_each(self, messages: Iterable[Outgoing]) -> list[int]:
        """Publish messages that each carry their own attributes and key, in order; returns their offsets
        once every one is answered. Every message is checked before any is queued (a bad one raises and
        sends nothing). Nothing waits for linger: the batches are sealed as soon as the messages are queued.
        Calls made one after another keep their order even while an earlier one waits for buffer room.

        Raises the first failed batch's error after every batch of the call has been answered; messages
        of the other batches may be stored."""
        self._check_open()
        limit = min(p.max_bytes - p.overhead for p in self._pubs)
        checked: list[tuple[Payload, dict[str, str], str | None, int]] = []
        for payload, attributes, key in messages:
            if type(payload) not in _BYTES_TYPES:
                raise TypeError(f"payload must be bytes, not {type(payload).__name__}")
            size = len(payload)
            if attributes or key is not None:
                _check_message(attributes, key)
                size += attributes_size(attributes, key)
            if size > limit:
                raise errors.InvalidArgument(
                    f"message of {len(payload)} bytes exceeds the batch limit of {limit} bytes"
                )
            checked.append((payload, attributes or _NO_ATTRS, key, size))
        placed: list[tuple[Batch, int]] = []
        touched: set[PartitionPublisher] = set()
        async with self._each_order:
            ts = _now_ms()
            for payload, attributes, key, size in checked:
                if self._full(1, size):
                    for p in touched:
                        p.seal()  # what is queued must go out for room to appear
                    await self._wait_room(1, size)
                pub = self._pubs[self._router.current if key is None else self._router.for_key(key)]
                self._buffered += 1
                self._buffered_bytes += size + pub.overhead
                placed.append(pub.append(payload, size + pub.overhead, ts, attributes, key, None))
                touched.add(pub)
            for p in touched:
                p.seal()
        if not placed:
            return []
        await asyncio.wait([b.done for b in dict.fromkeys(b for b, _ in placed)])
        return [batch.done.result() + index for batch, index in placed]

    def batch_limits(self) -> tuple[int, int]:
        """(messages, bytes) one batch may hold (the smaller of this producer's and the broker's limits);
        a message takes `message_size` bytes of it."""
        return min(p.max_count for p in self._pubs), min(p.max_bytes for p in self._pubs)

    def message_size(self, payload: Payload, attributes: dict[str, str] | None, key: str | None) -> int:
        """What a message counts against `batch_limits`' bytes."""
        extra = attributes_size(attributes, key) if attributes or key is not None else 0
        return len(payload) + extra + max(p.overhead for p in self._pubs)

    async def send_whole(self, messages: Sequence[Outgoing]) -> int:
        """Publish `messages` as one batch of their own (nothing before or after them in it) and return its
        first offset. The caller cuts its messages into batches (within `batch_limits`), so the same messages
        cut the same way make the same batches and sequences again: what a fixed `producer_key` needs for a
        repeat to be recognised (the Spark sink's exactly-once). One topic or partition only."""
        self._check_open()
        if len(self._pubs) != 1:
            raise errors.InvalidArgument(f"send_whole publishes to one partition; {self.topic} has several")
        if not messages:
            raise errors.InvalidArgument("send_whole needs at least one message")
        pub = self._pubs[0]
        sized = []
        for payload, attributes, key in messages:
            if type(payload) not in _BYTES_TYPES:
                raise TypeError(f"payload must be bytes, not {type(payload).__name__}")
            if attributes or key is not None:
                _check_message(attributes, key)
            sized.append((payload, attributes or _NO_ATTRS, key, self.message_size(payload, attributes, key)))
        total = sum(size for *_, size in sized)
        if len(sized) > pub.max_count or total > pub.max_bytes:
            raise errors.InvalidArgument(
                f"{len(sized)} messages of {total} bytes do not fit one batch "
                f"({pub.max_count} messages, {pub.max_bytes} bytes)"
            )
        async with self._each_order:
            await self._wait_room(len(sized), total)
            pub.seal()
            ts = _now_ms()
            self._buffered += len(sized)
            self._buffered_bytes += total
            # no await in between: neither linger nor another sender can cut or join this batch
            batches = {pub.append(p, size, ts, attrs, key, None)[0] for p, attrs, key, size in sized}
            pub.seal()
        (batch,) = batches
        await asyncio.wait([batch.done])
        return batch.done.result()

    async def send_batch(
        self,
        payloads: Sequence[Payload],
        attributes: dict[str, str] | None = None,
        key: str | None = None,
    ) -> list[int]:
        """Publish many messages (sharing `attributes` and `key`); returns their offsets in order once every
        one is acknowledged. They are sealed into batches at once (no linger). On partitioned topics
        without a key, consecutive batches go to consecutive partitions, so offsets are per partition.

        If a batch fails, the error is raised after every batch of the call has been answered; messages
        of the other batches may be stored."""
        self._check_open()
        if not payloads:
            return []
        if not set(map(type, payloads)) <= _BYTES_TYPES:
            raise TypeError("payloads must be bytes")
        attrs = attributes or _NO_ATTRS
        extra = 0
        if attrs or key is not None:
            _check_message(attrs, key)
            extra = attributes_size(attrs, key)
        limit = min(p.max_bytes - p.overhead for p in self._pubs) - extra
        biggest = max(map(len, payloads))
        if biggest > limit:
            raise errors.InvalidArgument(f"a message of {biggest} bytes exceeds the batch limit")
        ts = _now_ms()
        segments: list[tuple[Batch, int, int]] = []  # (batch, index in batch, count)
        touched: set[PartitionPublisher] = set()
        i, n = 0, len(payloads)
        while i < n:
            pub = self._pubs[self._router.current if key is None else self._router.for_key(key)]
            if self._full(1, 0):
                for p in touched:
                    p.seal()  # what is buffered must go out for room to appear
                await self._wait_room(1, 0)
                continue
            room = self._max_buffered - self._buffered
            batch, index, stop, nbytes = pub.append_many(payloads, i, ts, attrs, key, extra, max(1, room))
            count = stop - i
            self._buffered += count
            self._buffered_bytes += nbytes
            segments.append((batch, index, count))
            touched.add(pub)
            i = stop
        for p in touched:
            p.seal()
        done = [b.done for b in dict.fromkeys(b for b, _, _ in segments)]
        await asyncio.wait(done)  # never cancels the batches (other senders may share them)
        offsets: list[int] = []
        for batch, index, count in segments:
            first = batch.done.result() + index  # raises the batch's error
            offsets.extend(range(first, first + count))
        return offsets

    async def flush(self) -> None:
        """Seal every open batch and wait until all messages sent so far are answered (acked or failed;
        failures are reported to their own send() / futures, not here)."""
        waits = []
        for p in self._pubs:
            p.seal()
            if p.last is not None and not p.last.done.done():
                waits.append(p.last.done)
        if waits:
            await asyncio.wait(waits)

    async def close(self, timeout: float | None = 30.0) -> None:  # noqa: ASYNC109
        """Flush (up to `timeout` seconds), then close the streams. Messages still unacknowledged fail with
        Unavailable."""
        if self._closed:
            return
        try:
            async with asyncio.timeout(timeout):
                await self.flush()
        except TimeoutError:
            pass
        finally:
            self._closed = True
            self._space.set()
            await asyncio.gather(*(p.close() for p in self._pubs), return_exceptions=True)
            self._client._forget(self)

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
