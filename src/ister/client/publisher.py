"""One Publish stream to one topic (or partition): batching, flow control, ordered acks and reconnect.

Batching: messages are appended to an open batch, which is sealed when it reaches max_batch_messages or
max_batch_bytes (the smaller of the producer's and the broker's limits), when `linger` expires after its
first message, or on flush. Sealed batches are written in order with strictly increasing sequence numbers;
at most max_inflight_batches are unacknowledged at once; the broker acks each batch, in order, once it is
durable (reliable topics).

Reconnect: when the stream fails with a retriable status (UNAVAILABLE, a dropped connection, a timeout),
the publisher looks the topic up again, opens a new stream and re-sends every batch not yet acknowledged,
in the original order. With idempotence (the default; docs/idempotence.md) every batch carries the
producer's key and its first message's sequence (drawn when the batch is first sent, kept on re-sends), so
a batch whose ack was lost is answered with its original offsets and stored once; without it, such a batch
may be stored twice (at-least-once). With a key given by the caller (`fixed_key`, the Spark sink's) the
publisher never renumbers and never changes key: its first failure fails every later batch.

When the topic's owner dies, the lookups name it until the cluster reassigns the topic
(its lease TTL plus about a second); opening a stream to it fails at once (connection refused) or within
connect_timeout, so the publisher keeps looking up until another broker serves the topic and continues
there. Retries are bounded (the client's retry_timeout, and max_retries when set; exponential backoff with
jitter); when they are exhausted every pending batch fails with Unavailable (or Timeout) naming the topic,
and the publisher waits for new messages before trying again. A non-retriable status (InvalidArgument,
NotFound, FailedPrecondition, ...) fails only the batch that caused it (the broker stores nothing of it and
acks everything before it); the remaining batches are re-sent on a new stream, their sequences moved down
by the failed batch's count (the broker stored nothing after it either). OutOfOrderSequence (the broker
misses messages before a batch: a bug, or two producers sharing a key) fails every pending batch and the
producer goes on under a new key, numbering from 0 again; so it does after its retries are exhausted (whether
the broker stored the batches that failed then is unknown). If the stream cannot even be
opened with a non-retriable status, every pending batch fails.

Deadlines: opening a stream (the open frame written and answered) takes at most connect_timeout; while
batches are outstanding, each ack must come within ACK_TIMEOUT_SECONDS of the previous one (the backstop);
a dead or frozen broker is found by gRPC's pings first: keepalive every 10 s, any ping unanswered for 5 s
ends the connection (`_conn.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Sequence
from itertools import accumulate
from typing import TYPE_CHECKING, Any

import grpc

from ister import errors
from ister.client.errors import ConnectionLost
from ister.client.reconnect import ReconnectingStream
from ister.client.records import RECORD_OVERHEAD, Batch, Payload, new_producer_key
from ister.client.streams import raise_call_status, run_until_first_error
from ister.core.compression import Codec
from ister.wire.gen import ister_v1_pb2 as pb

if TYPE_CHECKING:
    from ister.client.client import Client

log = logging.getLogger(__name__)

DEFAULT_INFLIGHT = 16  # when the broker names no limit
DICTIONARY_RETRY_SECONDS = 10.0  # after a failed dictionary fetch, the next ack naming it tries again
ACK_TIMEOUT_SECONDS = 45.0  # the broker fails a publish whose fsync takes 30 s; this is the backstop


class PartitionPublisher(ReconnectingStream):
    """The publish stream of one topic. Created and driven by `Producer`; not thread-safe."""

    def __init__(
        self,
        client: Client,
        topic: str,
        name: str,
        *,
        reliable: bool,
        linger: float,
        max_batch_messages: int,
        max_batch_bytes: int,
        max_inflight: int | None,
        on_seal: Callable[[], None],
        on_release: Callable[[int, int], None],
        producer_key: int = 0,
        codec: Codec = Codec.NONE,
        fixed_key: bool = False,
    ) -> None:
        self.client = client
        self.producer_key = producer_key  # 0: not idempotent
        self.codec = codec  # records are sent (and stored) compressed with it
        # zstd only: the topic's dictionary as the broker last named it, and the one records are compressed
        # with once it is loaded here (0: plain zstd; docs/compression.md, "Dictionaries")
        self._dict_named = 0
        self.dict_id = 0
        self._dict_task: asyncio.Task[None] | None = None
        # A key chosen by the caller (the Spark sink's, derived from its micro-batch): never replaced and no
        # sequence renumbered, so a re-run of the same sends maps onto the same sequences; after a failure
        # every batch fails (`_broken`) instead of going on under a new key.
        self._fixed_key = fixed_key
        self._broken: errors.IsterError | None = None
        self._next_seq = 0  # the sequence of the next message sent for the first time
        self.topic = topic
        self.name = name
        self._reliable = reliable
        self._linger = linger
        self._user_count = max_batch_messages
        self._user_bytes = max_batch_bytes
        self._user_inflight = max_inflight
        self.max_count = max_batch_messages
        self.max_bytes = max_batch_bytes
        self._max_inflight = max_inflight or DEFAULT_INFLIGHT
        self._on_seal = on_seal
        self._on_release = on_release
        self.overhead = RECORD_OVERHEAD + len(name.encode())
        self.schema: tuple[int | None, int | None] = (None, None)  # stamped on every record (id, version)
        self.schema_subject = ""  # named at open: the broker binds an unbound topic to it
        self._loop = asyncio.get_running_loop()
        self._pid = 0
        self._seq = 0
        self.open: Batch | None = None
        self.last: Batch | None = None  # the newest batch created (for flush)
        self._queue: deque[Batch] = deque()  # sealed, not yet written on the current stream
        self._inflight: deque[Batch] = deque()  # written, not yet acknowledged
        self._wake = asyncio.Event()  # sender: queue or inflight window changed
        self._work = asyncio.Event()  # run loop idle after a failure: new work arrived
        self._ack_deadline: asyncio.Timeout | None = None
        self._acked_in_session = 0
        self._probe = False
        self._resend_upto = 0  # highest sequence written on a stream so far
        self._phase = "lookup"
        self._closing = False
        self._ready: asyncio.Future[None] = self._loop.create_future()
        self._task: asyncio.Task[None] | None = None

    # -- lifecycle ------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Open the stream; raises the typed error when the first open fails for good."""
        self._task = asyncio.create_task(self._run(), name=f"ister-publish:{self.topic}")
        await asyncio.shield(self._ready)

    async def close(self) -> None:
        """Stop the stream task; anything still pending fails with Unavailable("producer closed")."""
        self._closing = True
        self._work.set()
        if self._dict_task is not None:
            self._dict_task.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._fail_all(errors.Unavailable(f"producer {self.name!r} on {self.topic} is closed"))

    @property
    def pending_batches(self) -> int:
        return len(self._queue) + len(self._inflight) + (1 if self.open is not None else 0)

    # -- appending (hot path) -------------------------------------------------------------------------------
    def _new_batch(self) -> Batch:
        self._seq += 1
        b = Batch(self._seq, self._loop)
        self.open = self.last = b
        if self._linger > 0:
            self._loop.call_later(self._linger, self._linger_expired, b)
        else:
            self._loop.call_soon(self._linger_expired, b)
        return b

    def _linger_expired(self, b: Batch) -> None:
        if self.open is b:
            self.seal()

    def seal(self) -> None:
        b = self.open
        if b is None:
            return
        self.open = None
        if self._broken is not None:
            self._release(b)
            b.fail(self._broken)
            return
        self._queue.append(b)
        self._wake.set()
        self._work.set()
        self._on_seal()

    def append(
        self,
        payload: Payload,
        size: int,
        ts: int,
        attributes: dict[str, str],
        key: str | None,
        fut: asyncio.Future[int] | None,
    ) -> tuple[Batch, int]:
        b = self.open
        if b is None:
            b = self._new_batch()
        elif b.nbytes + size > self.max_bytes:
            self.seal()
            b = self._new_batch()
        index = b.count
        segs = b.segs
        last = segs[-1] if segs else None
        if last is not None and last[1] == ts and last[2] is attributes and last[3] == key:
            last[0].append(payload)
        else:
            segs.append([[payload], ts, attributes, key])
        b.count = index + 1
        b.nbytes += size
        if fut is not None:
            if b.futs is None:
                b.futs = []
            b.futs.append((index, fut))
        if index + 1 >= self.max_count:
            self.seal()
        return b, index

    def append_many(
        self,
        payloads: Sequence[Payload],
        start: int,
        ts: int,
        attributes: dict[str, str],
        key: str | None,
        extra: int,
        limit: int,
    ) -> tuple[Batch, int, int, int]:
        """Append payloads[start:stop] (at most `limit`, at least one) for the largest stop the open batch
        takes; returns (batch, index of payloads[start] in it, stop, bytes added). Seals a full batch."""
        b = self.open
        if b is None:
            b = self._new_batch()
        room = min(self.max_count - b.count, limit)
        chunk = payloads[start : start + room]  # a slice, not islice: islice would skip `start` items
        sizes = list(accumulate(map(len, chunk)))
        per = self.overhead + extra
        budget = self.max_bytes - b.nbytes
        fit = bisect_right(range(len(sizes)), budget, key=lambda j: sizes[j] + per * (j + 1))
        if fit == 0:
            if b.count:
                self.seal()
                return self.append_many(payloads, start, ts, attributes, key, extra, limit)
            fit = 1  # one oversize message alone (the producer checked it against the limit)
        stop = start + fit
        index = b.count
        b.segs.append([chunk if fit == len(chunk) else chunk[:fit], ts, attributes, key])
        b.count += fit
        added = sizes[fit - 1] + per * fit
        b.nbytes += added
        if b.count >= self.max_count or b.nbytes >= self.max_bytes:
            self.seal()
        return b, index, stop, added

    # -- the stream -----------------------------------------------------------------------------------------
    # The reconnect loop (ReconnectingStream._run) calls these.
    def _progressed(self) -> bool:
        return bool(self._acked_in_session) or (
            self._phase == "stream" and not self._inflight and not self._queue
        )

    async def _rejected(self, err: errors.IsterError) -> None:
        if isinstance(err, errors.OutOfOrderSequence) or (
            self._fixed_key and not isinstance(err, errors.DuplicateSequence)
        ):
            await self._give_up(err)
            return
        if self._phase == "stream" and self._inflight:
            bad = self._inflight.popleft()
            log.warning("%s: batch %d rejected: %s", self.topic, bad.seq, err)
            self._release(bad)
            bad.fail(err)
            if bad.first_seq >= 0 and not isinstance(err, errors.DuplicateSequence):
                self._renumber_after(bad)
            return  # re-open at once and re-send the batches after it
        await self._give_up(err)

    def _renumber_after(self, bad: Batch) -> None:
        """`bad` was refused and nothing after it stored: the later batches take its sequences."""
        for b in (*self._inflight, *self._queue):
            if b.first_seq > bad.first_seq:
                b.first_seq -= bad.count
        self._next_seq -= bad.count

    def _new_key(self) -> None:
        """Continue as a new idempotent producer: a fresh key, sequences from 0 (pending batches failed)."""
        self.producer_key = new_producer_key()
        self._next_seq = 0
        for b in (*self._inflight, *self._queue):
            b.first_seq = -1

    async def _exhausted(self, err: errors.IsterError) -> None:
        await self._give_up(err)

    def _activity(self) -> str:
        return f"{self.topic}: publishing"

    def _failure(self) -> str:
        return f"publish stream failed in {self._phase}"

    async def _give_up(self, err: errors.IsterError) -> None:
        """Fail everything pending with `err`, then wait until there is new work (or the first open)."""
        if not self._ready.done():
            self._ready.set_exception(err)
            self._ready.exception()
            self._closing = True
            return
        log.warning("%s: publishing failed: %s", self.topic, err)
        if self._fixed_key:  # the caller's numbering must hold: stop here, every later batch fails
            self._broken = err
            self._fail_all(err)
            self._closing = True
            return
        if self.producer_key:
            # Whether the broker stored the failed batches is unknown: go on as a new producer, so that
            # the next batch is neither taken for a retry nor refused as out of order.
            self._new_key()
        self._fail_all(err)
        self._work.clear()
        while not self._queue and not self._closing:
            await self._work.wait()
            self._work.clear()

    def _fail_all(self, err: BaseException) -> None:
        batches = [*self._inflight, *self._queue]
        if self.open is not None:
            batches.append(self.open)
            self.open = None
        self._inflight.clear()
        self._queue.clear()
        for b in batches:
            self._release(b)
            b.fail(err)

    def _release(self, b: Batch) -> None:
        self._on_release(b.count, b.nbytes)

    async def _session(self) -> None:
        self._phase = "lookup"
        self._acked_in_session = 0
        url, stub = await self.client.route(self.topic)
        self._phase = "open"
        # Not wait_for_ready: an owner that died fails the open at once (or within connect_timeout), and
        # the retry looks the topic up again instead of waiting for that address to come back.
        call: Any = stub.Publish()
        try:
            delivery = pb.RELIABLE if self._reliable else pb.NON_RELIABLE
            opening = pb.PublishOpen(
                topic=self.topic,
                producer_name=self.name,
                delivery=delivery,
                schema_subject=self.schema_subject,
            )
            request = pb.PublishRequest(open=opening)
            self._opened(await self._open(call, request, url, "publish", "PublishOpen"))
            self._phase = "stream"
            # Everything unacknowledged goes out again on this stream, in order; the first batch alone
            # until it is acked, so that if it is the one that broke the last stream its rejection comes
            # back with no other write racing it (see ister.client.errors.MASKED_STATUS_DETAILS).
            self._queue.extendleft(reversed(self._inflight))
            self._inflight.clear()
            self._probe = bool(self._queue) and self._queue[0].seq <= self._resend_upto
            self._wake.set()
            if not self._ready.done():
                if self._dict_task is not None:  # the first batches compress with the topic's dictionary
                    await asyncio.wait({self._dict_task}, timeout=self.client.connect_timeout)
                self._ready.set_result(None)
            await run_until_first_error(
                self._recv_loop(call), self._send_loop(call), name=f"ister-publish:{self.topic}"
            )
        finally:
            call.cancel()

    def _opened(self, opened: Any) -> None:
        self._pid = int(opened.producer_id)
        srv_count, srv_bytes = int(opened.max_batch_count), int(opened.max_batch_bytes)
        self.max_count = min(self._user_count, srv_count) if srv_count else self._user_count
        self.max_bytes = min(self._user_bytes, srv_bytes) if srv_bytes else self._user_bytes
        srv_inflight = int(opened.max_inflight_batches)
        if self._user_inflight and srv_inflight:
            self._max_inflight = min(self._user_inflight, srv_inflight)
        else:
            self._max_inflight = self._user_inflight or srv_inflight or DEFAULT_INFLIGHT
        self._dictionary_named(int(opened.dictionary_id))

    def _dictionary_named(self, dict_id: int) -> None:
        """The broker named the topic's zstd dictionary (0: none): compress with it once it is loaded here,
        fetching it in the background; batches encoded meanwhile are plain zstd (valid as well)."""
        if self.codec is not Codec.ZSTD or dict_id == self._dict_named:
            return
        self._dict_named = dict_id
        if not dict_id or dict_id in self.client.dictionaries.registry:
            self.dict_id = dict_id
        elif self._dict_task is None:
            self._dict_task = self._loop.create_task(self._fetch_dictionary(dict_id))

    async def _fetch_dictionary(self, dict_id: int) -> None:
        try:
            await self.client.dictionaries.ensure(self.topic, dict_id)
            if self._dict_named == dict_id:
                self.dict_id = dict_id
        except errors.IsterError as exc:
            log.warning(
                "%s: zstd dictionary %d not fetched, records stay plain zstd: %s", self.topic, dict_id, exc
            )
            self._loop.call_later(DICTIONARY_RETRY_SECONDS, self._forget_named, dict_id)
        finally:
            self._dict_task = None
            if self._dict_named != dict_id and not self._closing:  # another one was named meanwhile
                named, self._dict_named = self._dict_named, 0
                self._dictionary_named(named)

    def _forget_named(self, dict_id: int) -> None:
        if self._dict_named == dict_id and self.dict_id != dict_id:
            self._dict_named = 0  # the next ack naming it fetches it again

    async def _send_loop(self, call: Any) -> None:
        queue, inflight, wake = self._queue, self._inflight, self._wake
        Request, BatchMsg = pb.PublishRequest, pb.PublishBatch
        while True:
            while not queue or len(inflight) >= (1 if self._probe else self._max_inflight):
                wake.clear()
                await wake.wait()
            b = queue.popleft()
            try:
                records = b.encode(self._pid, self.name, self.schema, self.codec, self.dict_id)
            except (TypeError, ValueError, OverflowError) as exc:  # a value msgpack cannot carry
                self._release(b)
                b.fail(errors.InvalidArgument(f"cannot encode the batch: {exc}"))
                continue
            if b.first_seq < 0:
                b.first_seq = self._next_seq
                self._next_seq += b.count
            inflight.append(b)
            if b.seq > self._resend_upto:
                self._resend_upto = b.seq
            deadline = self._ack_deadline
            if deadline is not None and deadline.when() is None:
                deadline.reschedule(self._loop.time() + ACK_TIMEOUT_SECONDS)
            try:
                batch = BatchMsg(
                    sequence=b.seq,
                    records=records,
                    count=b.count,
                    producer_key=self.producer_key,
                    first_sequence=b.first_seq if self.producer_key else 0,
                    codec=self.codec,
                    uncompressed_size=b.plain_size,
                )
                await call.write(Request(batch=batch))
            except Exception:
                await raise_call_status(call, "writing to the publish stream failed")

    async def _recv_loop(self, call: Any) -> None:
        inflight = self._inflight
        eof = grpc.aio.EOF
        loop = self._loop
        while True:
            async with asyncio.timeout(None) as deadline:
                self._ack_deadline = deadline
                if inflight:
                    deadline.reschedule(loop.time() + ACK_TIMEOUT_SECONDS)
                try:
                    resp = await call.read()
                finally:
                    self._ack_deadline = None
            if resp is eof:
                if self._closing and not inflight and not self._queue:
                    return
                await raise_call_status(call, "the publish stream ended")
            if resp.WhichOneof("kind") != "ack":
                raise errors.Unavailable(f"{self.topic}: unexpected {resp.WhichOneof('kind')} on the stream")
            ack = resp.ack
            if not inflight or inflight[0].seq != ack.sequence:
                expected = inflight[0].seq if inflight else None
                raise ConnectionLost(f"{self.topic}: ack for batch {ack.sequence}, expected {expected}")
            if ack.dictionary_id != self._dict_named:
                self._dictionary_named(int(ack.dictionary_id))
            b = inflight.popleft()
            self._acked_in_session += 1
            self._probe = False
            self._release(b)
            b.resolve(int(ack.first_offset))
            self._wake.set()
