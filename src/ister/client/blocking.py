"""Blocking facade over the asyncio client, for threads without an event loop (Spark executors, the CLI).

`BlockingClient` submits every call with `asyncio.run_coroutine_threadsafe` to an event loop (uvloop) in a
daemon thread, one per process and shared by all blocking clients; results and the typed errors of
`ister.errors` come back to the calling thread. Each call waits at most `call_timeout` seconds (Timeout
otherwise). Several threads may share one client. Close it (or use `with`) to flush producers and end
consumers.

    with BlockingClient("http://127.0.0.1:6650") as client:
        with client.producer("/default/t") as producer:
            offset = producer.send(b"data")
        with client.consumer("/default/t", "sub") as consumer:
            for msg in consumer:          # stops when the consumer is closed
                consumer.ack(msg)
        span = client.offsets("/default/t")  # a reliable topic's stored offsets (no subscription)
        for batch in client.read("/default/t", span.earliest, span.next):
            ...                               # [(offset, record bytes), ...]
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
from collections import deque
from collections.abc import AsyncIterator, Coroutine, Iterator, Sequence
from typing import Any, TypeVar

from ister import errors
from ister.client.client import Client, TopicOffsets
from ister.client.consumer import Consumer
from ister.client.messages import Message
from ister.client.producer import Outgoing, Producer
from ister.client.records import Payload

T = TypeVar("T")
DEFAULT_CALL_TIMEOUT = 120.0


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; plain asyncio still works
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


class _LoopThread:
    """An event loop in a daemon thread. One per process, shared by every BlockingClient and never closed:
    grpc.aio's completion queue stays bound to a loop, so a closed loop followed by a new one makes it
    fail callbacks with "Event loop is closed"."""

    _shared: _LoopThread | None = None
    _shared_pid = 0
    _lock = threading.Lock()

    @classmethod
    def shared(cls) -> _LoopThread:
        with cls._lock:
            if cls._shared is None or cls._shared_pid != os.getpid() or not cls._shared.thread.is_alive():
                cls._shared = cls()  # a forked child gets its own (threads do not survive fork)
                cls._shared_pid = os.getpid()
            return cls._shared

    def __init__(self) -> None:
        self.loop = _new_loop()
        self._started = threading.Event()
        self.thread = threading.Thread(target=self._main, name="ister-client-loop", daemon=True)
        self.thread.start()
        self._started.wait()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._started.set)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
        if threading.current_thread() is self.thread:
            coro.close()
            raise RuntimeError("blocking client calls cannot be made from its own event loop thread")
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise errors.Timeout(f"the call did not finish within {timeout} s") from None


class BlockingClient:
    """A `Client` driven from ordinary threads. Keyword arguments are those of `Client`."""

    def __init__(
        self, url: str = "http://127.0.0.1:6650", *, call_timeout: float = DEFAULT_CALL_TIMEOUT, **kw: Any
    ) -> None:
        self.call_timeout = call_timeout
        self._runner = _LoopThread.shared()
        self._closed = False
        self.client = self._run(self._connect(url, kw))

    @staticmethod
    async def _connect(url: str, kw: dict[str, Any]) -> Client:
        return await Client(url, **kw).connect()

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return self._runner.run(coro, self.call_timeout if timeout is None else timeout)

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run a coroutine of `self.client` (e.g. `client.schemas.latest(subject)`) on the client's loop
        and return its result (within the call timeout unless `timeout` is given)."""
        return self._run(coro, timeout)

    def _call_soon(self, fn: Any, *args: Any) -> None:
        self._runner.loop.call_soon_threadsafe(fn, *args)

    def producer(self, topic: str, name: str | None = None, **kw: Any) -> BlockingProducer:
        """See `Client.producer` for the keyword arguments."""
        return BlockingProducer(self, self._run(self.client.producer(topic, name, **kw)))

    def consumer(self, topic: str, subscription: str, **kw: Any) -> BlockingConsumer:
        """See `Client.consumer` for the keyword arguments."""
        return BlockingConsumer(self, self._run(self.client.consumer(topic, subscription, **kw)))

    def partitions(self, topic: str) -> list[str]:
        """The concrete topics behind `topic`: its partitions, or [topic]; [] when it does not exist."""
        found = self._run(self.client.lookup_with_retry(topic))
        if found is None:
            return []
        return list(found.partitions) or [topic]

    def offsets(self, topic: str) -> TopicOffsets:
        """See `Client.offsets`."""
        return self._run(self.client.offsets(topic))

    def offset_for_time(self, topic: str, when_ms: int) -> int:
        """See `Client.offset_for_time`."""
        return self._run(self.client.offset_for_time(topic, when_ms))

    def set_cursor(self, topic: str, subscription: str, next_offset: int) -> int:
        """See `Client.set_cursor`."""
        return self._run(self.client.set_cursor(topic, subscription, next_offset))

    def read(
        self, topic: str, start: int, end: int, max_records: int = 10_000
    ) -> Iterator[list[tuple[int, bytes]]]:
        """See `Client.read`: batches of (offset, record bytes) with start <= offset < end, in offset order.
        Each batch waits at most the call timeout. Closing the iterator early ends the read."""
        batches = self.client.read(topic, start, end, max_records=max_records)
        try:
            while True:
                batch = self._run(_next_or_none(batches))
                if batch is None:
                    return
                yield batch
        finally:
            if not self._closed and self._runner.loop.is_running():
                with contextlib.suppress(Exception):  # best effort: the loop may be stopping
                    self._run(_aclose(batches), 10.0)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Flush and close every producer and consumer (the process's loop thread keeps running)."""
        if self._closed:
            return
        self._closed = True
        self._run(self.client.close())

    def __enter__(self) -> BlockingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _next_or_none(it: AsyncIterator[T]) -> T | None:
    try:
        return await anext(it)
    except StopAsyncIteration:
        return None


async def _aclose(it: Any) -> None:
    await it.aclose()


class BlockingProducer:
    def __init__(self, owner: BlockingClient, producer: Producer) -> None:
        self._owner = owner
        self.producer = producer

    @property
    def topic(self) -> str:
        return self.producer.topic

    @property
    def partitions(self) -> list[str]:
        return self.producer.partitions

    def send(self, payload: Payload, attributes: dict[str, str] | None = None, key: str | None = None) -> int:
        """Publish one message and wait for its offset (durable for reliable topics)."""
        return self._owner._run(self.producer.send(payload, attributes, key))

    def send_async(
        self, payload: Payload, attributes: dict[str, str] | None = None, key: str | None = None
    ) -> concurrent.futures.Future[int]:
        """Publish without waiting; the returned future resolves to the offset. Calls from one thread keep
        their order. Waits only while the producer's buffer is full."""
        return asyncio.run_coroutine_threadsafe(
            self.producer.send(payload, attributes, key), self._owner._runner.loop
        )

    def send_batch(
        self, payloads: Sequence[Payload], attributes: dict[str, str] | None = None, key: str | None = None
    ) -> list[int]:
        """Publish many messages; returns their offsets once all are acknowledged."""
        return self._owner._run(self.producer.send_batch(payloads, attributes, key))

    def send_each_async(self, messages: Sequence[Outgoing]) -> concurrent.futures.Future[list[int]]:
        """`Producer.send_each` without waiting: the future resolves to the offsets once every message is
        answered. Calls from one thread keep their order; pipeline a few to keep the broker busy."""
        return asyncio.run_coroutine_threadsafe(self.producer.send_each(messages), self._owner._runner.loop)

    def send_whole_async(self, messages: Sequence[Outgoing]) -> concurrent.futures.Future[int]:
        """`Producer.send_whole` without waiting: the future resolves to the batch's first offset."""
        return asyncio.run_coroutine_threadsafe(self.producer.send_whole(messages), self._owner._runner.loop)

    def flush(self) -> None:
        self._owner._run(self.producer.flush())

    def close(self) -> None:
        self._owner._run(self.producer.close())

    def __enter__(self) -> BlockingProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class BlockingConsumer:
    """Messages are fetched in batches into a local buffer that `receive`, `receive_batch` and iteration
    share, so a thread pays one cross-thread call per batch, not per message."""

    def __init__(self, owner: BlockingClient, consumer: Consumer) -> None:
        self._owner = owner
        self.consumer = consumer
        self._buf: deque[Message] = deque()

    @property
    def topic(self) -> str:
        return self.consumer.topic

    def _fill(self, max_messages: int, timeout: float) -> None:
        batch = self._owner._run(self.consumer.receive_batch(max_messages, timeout), timeout + 10.0)
        self._buf.extend(batch)

    def receive(self, timeout: float | None = None) -> Message:
        """The next message; Timeout after `timeout` seconds (None: wait as long as the call timeout)."""
        if not self._buf:
            wait = self._owner.call_timeout if timeout is None else timeout
            self._fill(1000, wait)
            if not self._buf:
                if self.consumer._closed:
                    raise errors.FailedPrecondition("the consumer is closed")
                raise errors.Timeout(f"no message within {wait} s")
        return self._buf.popleft()

    def receive_batch(self, max_messages: int = 1000, timeout: float = 1.0) -> list[Message]:
        """Up to `max_messages`: waits up to `timeout` for the first; [] when none arrived."""
        if not self._buf:
            self._fill(max_messages, timeout)
        n = min(max_messages, len(self._buf))
        return [self._buf.popleft() for _ in range(n)]

    def ack(self, message: Message) -> None:
        """Acknowledge without waiting (coalesced and sent in the background)."""
        self._owner._call_soon(message.ack_nowait)

    def ack_batch(self, messages: Sequence[Message]) -> None:
        self._owner._call_soon(self.consumer.ack_batch_nowait, list(messages))

    def nack(self, message: Message, delay_ms: int | None = None, reason: str | None = None) -> None:
        self._owner._run(message.nack(delay_ms, reason))

    def __iter__(self) -> Iterator[Message]:
        """Messages until the consumer is closed (waits indefinitely between messages)."""
        while True:
            if not self._buf:
                self._fill(1000, 1.0)
                if not self._buf:
                    if self.consumer._closed:
                        return
                    continue
            yield self._buf.popleft()

    def close(self) -> None:
        self._owner._run(self.consumer.close())

    def __enter__(self) -> BlockingConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
