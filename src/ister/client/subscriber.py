"""One Consume stream to one topic (or partition): decoding, coalesced acks, nacks and reconnect.

Acks: offsets acknowledged by the application are collected and sent as OffsetRanges (gaps allowed) every
`ack_interval` seconds, or at once when `ack_batch` are pending. Unsent acks are bounded: `ack()` waits when
`max_pending_acks` are waiting (e.g. during a reconnect). An ack is fire-and-forget on the wire; one lost
with a broken connection only means a redelivery (at-least-once).

Reconnect: on a retriable failure the subscriber looks the topic up again and re-opens with the same
consumer name; the broker gives the same consumer back and redelivers what was delivered but not acked
(those messages arrive again with `redelivered=True`). Acks still pending are sent on the new stream.
When the topic's owner died, the lookups name it until the cluster reassigns the topic; opening a stream
to it fails at once (or within connect_timeout), so the subscriber keeps looking up until the new owner
serves it. Retries are bounded (the client's retry_timeout, and max_retries when set, with backoff); when
they are exhausted (Unavailable naming the topic), or the broker rejects the subscription (NotFound,
FailedPrecondition, ...), the error is handed to the application through the consumer (its iterator /
receive raises it). Waiting for messages has no deadline (a quiet topic is normal); a dead connection is
found by gRPC keepalive (about 15 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from functools import partial
from typing import TYPE_CHECKING, Any

import grpc

from ister import errors
from ister.client.messages import Message, decode_batch, offset_ranges
from ister.client.reconnect import ReconnectingStream
from ister.client.streams import raise_call_status, run_until_first_error
from ister.wire.gen import ister_v1_pb2 as pb

if TYPE_CHECKING:
    from ister.client.client import Client

log = logging.getLogger(__name__)

ACK_INTERVAL_SECONDS = 0.005
ACK_BATCH = 1024
MAX_PENDING_ACKS = 65536
MAX_RANGES_PER_FRAME = 4096  # the broker accepts up to 10,000 ranges in one Ack/Nack frame
STABLE_SECONDS = 5.0  # a stream that lived this long before failing resets the retry count


class Subscriber(ReconnectingStream):
    """The consume stream of one topic, feeding a shared queue. Created and driven by `Consumer`."""

    def __init__(
        self,
        client: Client,
        topic: str,
        subscription: str,
        consumer_name: str,
        sub_type: int,
        key_filters: tuple[str, ...],
        window: int,
        queue: asyncio.Queue[list[Message] | BaseException | None],
        *,
        initial_position: int = 0,
    ) -> None:
        self.client = client
        self.topic = topic
        self.subscription = subscription
        self.consumer_name = consumer_name
        self._sub_type = sub_type
        self._key_filters = key_filters
        self._window = window
        self._queue = queue
        self._initial_position = initial_position
        # The cursor epoch of the current stream (ConsumeOpened.cursor_epoch), and the one a seek waits for:
        # until a stream of that epoch opens, what arrives is from before the seek and is dropped.
        self.epoch = 0
        self._want_epoch: int | None = None
        self._loop = asyncio.get_running_loop()
        self.consumer_id = 0
        self.window = window
        self._max_seen = -1
        self._acks: list[int] = []
        self._upto: int | None = None
        self._nacks: list[tuple[list[int], int | None, str | None]] = []
        self._ack_wake = asyncio.Event()
        self._ack_room = asyncio.Event()
        self._ack_timer: asyncio.TimerHandle | None = None
        self._delivered_in_session = 0
        self._opened_at: float | None = None
        self.error: errors.IsterError | None = None
        self._err_task: asyncio.Task[None] | None = None
        self._closing = False
        self._leaving = False  # close(): half-close once the pending acks are written
        self._ready: asyncio.Future[None] = self._loop.create_future()
        self._task: asyncio.Task[None] | None = None

    # -- lifecycle ------------------------------------------------------------------------------------------
    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"ister-consume:{self.topic}")
        await asyncio.shield(self._ready)

    async def close(self, drain: float = 2.0) -> None:
        """Leave: send the acks still pending, then half-close the stream; the broker applies every ack it
        was sent before it ends the stream, so nothing acknowledged is redelivered. Waits up to `drain`
        seconds in all, then cancels the stream."""
        if self._task is None or self._task.done():
            return
        deadline = self._loop.time() + drain
        if self._acks or self._nacks or self._upto is not None:
            self._ack_wake.set()
            while (self._acks or self._nacks or self._upto is not None) and self._loop.time() < deadline:
                self._ack_room.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._ack_room.wait(), max(0.0, deadline - self._loop.time()))
        self._closing = True
        self._leaving = True
        self._ack_wake.set()
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(self._task), max(0.0, deadline - self._loop.time()))
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    # -- acks -----------------------------------------------------------------------------------------------
    def ack_nowait(self, offset: int) -> None:
        acks = self._acks
        acks.append(offset)
        if len(acks) >= ACK_BATCH:
            self._ack_wake.set()
        elif self._ack_timer is None:
            self._ack_timer = self._loop.call_later(ACK_INTERVAL_SECONDS, self._ack_due)

    def ack_many(self, offsets: list[int]) -> None:
        self._acks.extend(offsets)
        if len(self._acks) >= ACK_BATCH:
            self._ack_wake.set()
        elif self._ack_timer is None:
            self._ack_timer = self._loop.call_later(ACK_INTERVAL_SECONDS, self._ack_due)

    def ack_upto_nowait(self, offset: int) -> None:
        self._upto = offset if self._upto is None else max(self._upto, offset)
        self._ack_wake.set()

    async def ack(self, offset: int) -> None:
        self.ack_nowait(offset)
        await self.wait_ack_room()

    async def wait_ack_room(self) -> None:
        while len(self._acks) > MAX_PENDING_ACKS and not self._closing:
            self._ack_wake.set()
            self._ack_room.clear()
            await self._ack_room.wait()

    async def nack(self, offsets: list[int], delay_ms: int | None, reason: str | None) -> None:
        if delay_ms is not None and delay_ms < 0:
            raise errors.InvalidArgument("delay_ms must be >= 0")
        self._nacks.append((offsets, delay_ms, reason))
        self._ack_wake.set()
        await self.wait_ack_room()

    def expect_epoch(self, epoch: int) -> None:
        """A seek moved the subscription: drop what arrives until a stream of `epoch` is open."""
        if epoch != self.epoch:
            self._want_epoch = epoch
            self._drop_pending()

    def _drop_pending(self) -> None:
        """Acks and nacks not sent yet are for messages of an earlier cursor epoch: they would move the new
        cursor wrongly (the broker ignores what arrives on the old stream, not what a new one carries)."""
        self._acks.clear()
        self._upto = None
        self._nacks.clear()
        self._ack_room.set()

    def _ack_due(self) -> None:
        self._ack_timer = None
        self._ack_wake.set()

    # -- the stream -----------------------------------------------------------------------------------------
    # The reconnect loop (ReconnectingStream._run) calls these.
    def _progressed(self) -> bool:
        return self._opened_at is not None and (
            bool(self._delivered_in_session) or self._loop.time() - self._opened_at > STABLE_SECONDS
        )

    async def _rejected(self, err: errors.IsterError) -> None:
        self._fail(err)

    async def _exhausted(self, err: errors.IsterError) -> None:
        self._fail(err)

    def _activity(self) -> str:
        return f"{self.topic}: consuming {self.subscription}"

    def _failure(self) -> str:
        return "consume stream failed"

    def _fail(self, err: errors.IsterError) -> None:
        log.warning("%s/%s: consumer failed: %s", self.topic, self.subscription, err)
        self.error = err
        if not self._ready.done():
            self._ready.set_exception(err)
            self._ready.exception()
        else:
            try:
                self._queue.put_nowait(err)
            except asyncio.QueueFull:
                self._err_task = self._loop.create_task(self._queue.put(err))
        self._closing = True
        self._ack_room.set()

    async def _session(self) -> None:
        self._delivered_in_session = 0
        self._opened_at = None
        url, stub = await self.client.route(self.topic)
        # Not wait_for_ready: an owner that died fails the open at once (or within connect_timeout), and
        # the retry looks the topic up again instead of waiting for that address to come back.
        call: Any = stub.Consume()
        try:
            opening = pb.ConsumeOpen(
                topic=self.topic,
                subscription=self.subscription,
                consumer_name=self.consumer_name,
                subscription_type=self._sub_type,  # type: ignore[arg-type]
                key_filters=list(self._key_filters),
                window=self._window,
                initial_position=self._initial_position,  # type: ignore[arg-type]
                accept_compressed=True,  # decompressed here (client/messages.py)
                accept_dictionaries=True,  # fetched on demand (client/dictionaries.py)
            )
            opened = await self._open(call, pb.ConsumeRequest(open=opening), url, "consume", "ConsumeOpen")
            epoch = int(opened.cursor_epoch)
            if epoch != self.epoch and epoch != 0:
                self._drop_pending()  # the cursor was reset (0: the topic was loaded again, nothing reset)
            self.epoch = epoch
            if self._want_epoch == epoch:
                self._want_epoch = None
            self.consumer_id = int(opened.consumer_id)
            self.window = int(opened.window) or self._window
            self._opened_at = self._loop.time()
            if not self._ready.done():
                self._ready.set_result(None)
            self._ack_wake.set()  # acks left over from a previous stream
            await run_until_first_error(
                self._recv_loop(call), self._ack_loop(call), name=f"ister-consume:{self.topic}"
            )
            if not self._closing:
                await raise_call_status(call, "the consume stream ended")
        finally:
            call.cancel()

    async def _recv_loop(self, call: Any) -> None:
        queue = self._queue
        eof = grpc.aio.EOF
        while True:
            resp = await call.read()
            if resp is eof:
                return
            messages = await self._messages_of(resp)
            del resp
            # While leaving: the broker redelivers them to others. Before a seek's epoch: the old position's.
            if messages and not self._leaving and self._want_epoch is None:
                self._delivered_in_session += len(messages)
                await queue.put(messages)
            # Nothing of a batch stays here once the application's queue has it: a consumer that caught up
            # held its last batch (up to `window` decoded messages, and the frames) until the next came.
            del messages

    async def _messages_of(self, resp: Any) -> list[Message]:
        """The messages of one ConsumeResponse ([] for anything but a batch), after fetching any zstd
        dictionary its records need (a failed fetch ends the stream: its messages are redelivered)."""
        if resp.WhichOneof("kind") != "batch":
            return []
        batch = resp.batch
        messages, self._max_seen = await self.client.dictionaries.decode(
            self.topic, partial(decode_batch, batch.frames, batch.count, self, self._max_seen)
        )
        return messages

    async def _ack_loop(self, call: Any) -> None:
        wake = self._ack_wake
        while True:
            await wake.wait()
            wake.clear()
            if self._acks or self._upto is not None:
                acks, self._acks = self._acks, []
                upto, self._upto = self._upto, None
                ranges = [pb.OffsetRange(first=f, last=last) for f, last in offset_ranges(acks)]
                try:
                    for i in range(0, max(len(ranges), 1), MAX_RANGES_PER_FRAME):
                        ack = pb.Ack(ranges=ranges[i : i + MAX_RANGES_PER_FRAME])
                        if upto is not None and i + MAX_RANGES_PER_FRAME >= len(ranges):
                            ack.upto = upto
                        await call.write(pb.ConsumeRequest(ack=ack))
                except BaseException as exc:
                    self._acks[:0] = acks  # not sent: keep them for the next stream
                    if upto is not None:
                        self.ack_upto_nowait(upto)
                    if isinstance(exc, Exception):
                        await raise_call_status(call, "writing to the consume stream failed")
                    raise
                del acks, ranges  # sent: not kept while this loop waits for the next acks
            while self._nacks:
                offsets, delay_ms, reason = self._nacks[0]
                ranges = [pb.OffsetRange(first=f, last=last) for f, last in offset_ranges(list(offsets))]
                for i in range(0, len(ranges), MAX_RANGES_PER_FRAME):
                    nack = pb.Nack(ranges=ranges[i : i + MAX_RANGES_PER_FRAME])
                    if delay_ms is not None:
                        nack.delay_ms = delay_ms
                    if reason is not None:
                        nack.reason = reason
                    try:
                        await call.write(pb.ConsumeRequest(nack=nack))
                    except Exception:
                        await raise_call_status(call, "writing to the consume stream failed")
                self._nacks.pop(0)
            self._ack_room.set()
            if self._leaving and not (self._acks or self._nacks or self._upto is not None):
                # Every ack is written: the broker applies them, then ends the stream (the reader returns).
                await call.done_writing()
                await asyncio.Event().wait()
