"""The consumer: iterate or receive in batches, acknowledge by offset (coalesced into ranges).

Delivery is at-least-once: a message is delivered again after a nack, after the subscription's ack timeout,
or after a reconnect when its ack had not reached the broker. A consumer of a partitioned topic subscribes
to every partition and merges their messages (order holds within a partition, not across them); `ack_upto`
then needs the partition (pass a Message, or `topic=`).

Flow control: the broker delivers at most `window` unacknowledged messages per partition to the
subscription, so a consumer that does not ack stops receiving; the local buffer is bounded as well.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from enum import IntEnum
from typing import TYPE_CHECKING

from ister import errors
from ister.client.cursors import CursorPosition, SeekPosition
from ister.client.cursors import seek as seek_cursor
from ister.client.messages import Message
from ister.client.subscriber import MAX_PENDING_ACKS, Subscriber

if TYPE_CHECKING:
    from ister.client.client import Client


class SubType(IntEnum):
    """Subscription types, numbered as on the wire (the same values as `ister.core.dispatch.SubType`, which
    is accepted too; the client does not import the broker's dispatch code)."""

    EXCLUSIVE = 0
    SHARED = 1
    FAILOVER = 2
    KEY_SHARED = 3


QUEUE_BATCHES = 256  # decoded MessageBatches waiting for the application (each holds at most `window`)

Item = list[Message] | BaseException | None


class Consumer:
    """Receives from one subscription of one topic (all partitions). Create with `Client.consumer()`."""

    def __init__(self, client: Client, topic: str, subscription: str, name: str) -> None:
        self._client = client
        self.topic = topic
        self.subscription = subscription
        self.name = name
        self.queue: asyncio.Queue[Item] = asyncio.Queue(QUEUE_BATCHES)
        self._subs: list[Subscriber] = []
        self._by_topic: dict[str, Subscriber] = {}
        self._cur: list[Message] = []
        self._pos = 0
        self._stashed: list[Item] = []
        self._closed = False

    def _attach(self, subs: list[Subscriber]) -> None:
        self._subs = subs
        self._by_topic = {s.topic: s for s in subs}

    @property
    def partitions(self) -> list[str]:
        return [s.topic for s in self._subs]

    # -- receiving ------------------------------------------------------------------------------------------
    def _take(self, item: Item) -> None:
        if item is None:
            self._closed = True
            with contextlib.suppress(asyncio.QueueFull):
                self.queue.put_nowait(None)  # keep waking other waiters
            raise _Closed
        if isinstance(item, BaseException):
            raise item
        self._cur = item
        self._pos = 0

    async def _next_item(self, timeout: float | None) -> bool:  # noqa: ASYNC109
        """Fill the current buffer; False on timeout."""
        if self._closed:
            raise _Closed
        if self._stashed:
            self._take(self._stashed.pop())
            return True
        try:
            if timeout is None:
                item = await self.queue.get()
            else:
                item = await asyncio.wait_for(self.queue.get(), timeout)
        except TimeoutError:
            return False
        self._take(item)
        return True

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> Message:
        while self._pos >= len(self._cur):
            try:
                await self._next_item(None)
            except _Closed:
                raise StopAsyncIteration from None
        return self._pop()

    async def receive(self, timeout: float | None = None) -> Message:  # noqa: ASYNC109
        """The next message; raises Timeout after `timeout` seconds, FailedPrecondition once closed."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while self._pos >= len(self._cur):
            remaining = None if deadline is None else max(0.0, deadline - loop.time())
            try:
                got = await self._next_item(remaining)
            except _Closed:
                raise errors.FailedPrecondition(f"consumer {self.name!r} is closed") from None
            if not got:
                raise errors.Timeout(f"no message within {timeout} s")
        return self._pop()

    def _pop(self) -> Message:
        m = self._cur[self._pos]
        self._advance(1)
        return m

    def _advance(self, taken: int) -> None:
        """`taken` more messages of the current batch are the application's. Once it has all of them, none
        is kept while waiting for more (a consumer that caught up used to hold its last batch, up to
        `window` decoded messages)."""
        self._pos += taken
        if self._pos == len(self._cur):
            self._cur = []
            self._pos = 0

    async def receive_batch(
        self,
        max_messages: int = 1000,
        timeout: float | None = 1.0,  # noqa: ASYNC109
    ) -> list[Message]:
        """Up to `max_messages` messages: waits up to `timeout` for the first, then takes what is already
        here without waiting. An empty list means nothing arrived in time (or the consumer is closed)."""
        if max_messages < 1:
            raise errors.InvalidArgument("max_messages must be >= 1")
        out: list[Message] = []
        try:
            if self._pos >= len(self._cur) and not await self._next_item(timeout):
                return out
            while True:
                take = max_messages - len(out)
                if self._pos == 0 and len(self._cur) <= take:
                    out.extend(self._cur)
                    self._advance(len(self._cur))
                else:
                    chunk = self._cur[self._pos : self._pos + take]
                    out.extend(chunk)
                    self._advance(len(chunk))
                if len(out) >= max_messages or self.queue.empty():
                    return out
                item = self.queue.get_nowait()
                if not isinstance(item, list):
                    self._stashed.append(item)  # an error or the end: reported by the next call
                    return out
                self._take(item)
        except _Closed:
            return out

    # -- acknowledging --------------------------------------------------------------------------------------
    async def ack(self, message: Message) -> None:
        await message.ack()

    async def ack_batch(self, messages: Iterable[Message]) -> None:
        """Acknowledge many messages (sent as offset ranges in the background)."""
        if len(self._subs) == 1:
            sub = self._subs[0]
            epoch = sub.epoch
            sub.ack_many([m.offset for m in messages if m.epoch == epoch])
            await sub.wait_ack_room()
            return
        groups = _by_subscriber(messages)
        for sub, offsets in groups.items():
            sub.ack_many(offsets)
            await sub.wait_ack_room()

    def ack_batch_nowait(self, messages: Iterable[Message]) -> None:
        groups = _by_subscriber(messages)
        for sub, offsets in groups.items():
            sub.ack_many(offsets)

    def _sub_for(self, topic: str | None) -> Subscriber:
        if topic is None:
            if len(self._subs) != 1:
                raise errors.InvalidArgument("ack_upto on a partitioned topic needs the partition: topic=...")
            return self._subs[0]
        sub = self._by_topic.get(topic)
        if sub is None:
            raise errors.InvalidArgument(f"{topic} is not a partition of {self.topic}")
        return sub

    async def ack_upto(self, offset: int | Message, topic: str | None = None) -> None:
        """Cumulative ack: every message delivered to this consumer with an offset <= `offset` (on one
        partition: the message's, or `topic`) and not yet acked."""
        if isinstance(offset, Message):
            if offset.stale:
                return  # delivered before a cursor reset
            sub, value = offset._sub, offset.offset
        else:
            sub, value = self._sub_for(topic), offset
        sub.ack_upto_nowait(value)

    async def nack(self, message: Message, delay_ms: int | None = None, reason: str | None = None) -> None:
        await message.nack(delay_ms, reason)

    async def nack_batch(
        self, messages: Iterable[Message], delay_ms: int | None = None, reason: str | None = None
    ) -> None:
        for sub, offsets in _by_subscriber(messages).items():
            await sub.nack(offsets, delay_ms, reason)

    async def seek(self, position: SeekPosition) -> list[CursorPosition]:
        """Move this consumer's subscription (every partition) to `position`: an offset, a `datetime` (the
        first message published at or after it), "earliest" or "latest", and drop the messages received
        but not yet taken. The broker moves every consumer of the subscription (as Pulsar's seek); messages
        delivered from now on start at the new position. Messages taken before the seek can no longer be
        acknowledged (their acks are dropped: `Message.stale`)."""
        moves = []
        for sub in self._subs:
            move = await seek_cursor(self._client, sub.topic, self.subscription, position)
            sub.expect_epoch(move.epoch)
            moves.append(move)
        self._cur, self._pos = [], 0
        self._stashed = [item for item in self._stashed if not isinstance(item, list)]
        while not self.queue.empty():
            item = self.queue.get_nowait()
            if not isinstance(item, list):
                self._stashed.insert(0, item)  # an error or the end: still reported
        return moves

    # -- lifecycle ------------------------------------------------------------------------------------------
    async def close(self) -> None:
        """Send pending acks, leave (each stream is half-closed; the broker applies every ack before it ends
        it) and stop iteration; at most about 2 s. Messages delivered but not acked are redelivered by the
        broker (to this subscription's next consumer)."""
        if self._closed:
            return
        await asyncio.gather(*(s.close() for s in self._subs), return_exceptions=True)
        self._closed = True
        while not self.queue.empty():
            self.queue.get_nowait()
        self.queue.put_nowait(None)
        self._client._forget(self)

    async def __aenter__(self) -> Consumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class _Closed(Exception):
    pass


def _by_subscriber(messages: Iterable[Message]) -> dict[Subscriber, list[int]]:
    """Offsets by partition stream, without messages delivered before a cursor reset."""
    groups: dict[Subscriber, list[int]] = {}
    for m in messages:
        if m.epoch == m._sub.epoch:
            groups.setdefault(m._sub, []).append(m.offset)
    return groups


__all__ = ["MAX_PENDING_ACKS", "Consumer", "SubType"]
