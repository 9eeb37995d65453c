"""Servicer of the batch API (package `ister.v1`): many messages per frame, acknowledgements by range.

Semantics are those of the Danube services (same topics, subscriptions, cursors, redelivery and errors);
only the framing differs. Formats: docs/formats.md, "Batch API".
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import msgspec
from crc32c import crc32c

from ister.broker.dedup import TopicDedup
from ister.broker.service import BrokerService
from ister.broker.sessions import (
    CHUNK_MAX_BYTES,
    CHUNK_MAX_MESSAGES,
    ConsumerStream,
    OutChunk,
    ProducerSession,
)
from ister.broker.topic import Topic
from ister.core.frames import HEADER, HEADER_SIZE
from ister.core.record import (
    NO_ATTRIBUTES,
    LeanMessage,
    PublishedMessage,
    StoredMessage,
    check_attributes,
    decode_published,
    decode_published_lean,
)
from ister.errors import InvalidArgument, IsterError
from ister.ids import TopicName, shown
from ister.limits import (
    GRPC_MAX_MESSAGE_BYTES,
    MAX_NACK_REASON_BYTES,
    MAX_READ_RECORDS,
    MAX_WINDOW,
    MiB,
)
from ister.security.api_keys import ApiKeyStore
from ister.server.cursor_convert import move_to_wire, position_from_wire
from ister.server.errors import bidi_stream, server_stream, unary
from ister.server.handlers import add_service
from ister.server.ister_compressed import client_frames, client_record, get_dictionary, unpack_compressed
from ister.server.peers import peer_address as _peer
from ister.server.security_api import exchange_api_key
from ister.wire.enums import initial_position_from_wire, reliable_from_wire, sub_type_from_wire
from ister.wire.gen import ister_v1_pb2 as pb
from ister.wire.gen import ister_v1_pb2_grpc as pb_grpc

Ctx = Any  # grpc.aio.ServicerContext (untyped library)

MAX_INFLIGHT_BATCHES = 64
MAX_BATCH_COUNT = 65_536
MAX_BATCH_BYTES = GRPC_MAX_MESSAGE_BYTES - MiB
MAX_FRAME_BYTES = (
    CHUNK_MAX_BYTES  # consume frames: what one MessageBatch carries at most (one message may exceed it)
)
MAX_FRAME_MESSAGES = CHUNK_MAX_MESSAGES
MAX_ACK_RANGES = 10_000
READ_DEFAULT_RECORDS = 10_000  # Read: records per MessageBatch when the request says 0
READ_MAX_BYTES = 4 * MiB  # Read: record bytes per MessageBatch (one record may exceed it)
OPEN_TIMEOUT_SECONDS = 30.0


def decode_batch(
    batch: pb.PublishBatch,
    producer: ProducerSession,
    max_message_size: int,
    *,
    messages: bool,
    plain: bytes | None = None,
) -> tuple[list[msgspec.Raw], list[PublishedMessage], int, Sequence[StoredMessage | LeanMessage]]:
    """Validate one PublishBatch completely before anything is stored; returns (records, messages, bytes,
    the decoded records: payloads and schema ids for the topic's schema policy).

    Every field of every record is checked against the wire's ranges and the broker's limits, by the same
    rules as the Danube API's SendMessage (`ister.core.record`). `messages`: also return the records as
    StoredMessage (non-reliable dispatch routes and sends them); a reliable topic stores the records' bytes
    as they came and gets []. Reliable publishes are checked on lean records: a dict of attributes per
    record was a fifth of the work. `plain`: the records decompressed (a compressed batch)."""
    records = batch.records if plain is None else plain
    try:
        checked: Sequence[StoredMessage | LeanMessage]
        decoded: list[PublishedMessage] = []
        if messages:
            decoded, raws = decode_published(records)
            checked = decoded
        else:
            checked, raws = decode_published_lean(records)
        n = len(checked)
        if n == 0 or n != batch.count or n > MAX_BATCH_COUNT:
            raise InvalidArgument(f"{n} records, count says {batch.count} (1..{MAX_BATCH_COUNT} allowed)")
        pid, pname = producer.id, producer.name
        # One plain loop for the per-record checks, and no call for a record without attributes (most):
        # 42 against 109 ns a record as a generator plus a loop calling check_attributes each time.
        for m in checked:
            if m.producer_id != pid or m.producer_name != pname:
                raise InvalidArgument(f"records must carry producer {pid} ({shown(pname)})")
            a = m.attributes
            if a != NO_ATTRIBUTES:
                check_attributes(a)
        sizes = [len(m.payload) for m in checked]
        biggest = max(sizes)
        if max_message_size and biggest > max_message_size:
            raise InvalidArgument(f"message of {biggest} bytes exceeds max_message_size {max_message_size}")
    except InvalidArgument as exc:
        raise InvalidArgument(f"batch {batch.sequence}: {exc}") from None
    return raws, decoded, sum(sizes), checked


def idempotent_append(
    topic: Topic,
    dedup: TopicDedup,
    batch: pb.PublishBatch,
    raws: Sequence[bytes | msgspec.Raw],
    messages: list[PublishedMessage],
    nbytes: int,
) -> asyncio.Future[int]:
    def publish(records: Sequence[bytes | msgspec.Raw], on_offset: Callable[[int], None]) -> Awaitable[int]:
        return topic.publish_batch(records, messages, nbytes, on_offset)

    return dedup.publish(batch.producer_key, batch.first_sequence, list(raws), publish, topic.wait_committed)


class IsterServicer(pb_grpc.IsterServicer):  # type: ignore[misc]
    def __init__(self, broker: BrokerService, api_keys: ApiKeyStore | None = None) -> None:
        self.broker = broker
        self.validator = broker.validator
        self.api_keys = api_keys

    @unary
    async def ExchangeApiKey(
        self, request: pb.ExchangeApiKeyRequest, context: Ctx
    ) -> pb.ExchangeApiKeyResponse:
        return await exchange_api_key(self.api_keys, request)

    @unary
    async def Lookup(self, request: pb.LookupRequest, context: Ctx) -> pb.LookupResponse:
        name = TopicName.parse(request.topic)
        partitions = await self.broker.partitions(name)
        url = self.broker.broker_url
        if partitions == [name.full]:
            url, _ = await self.broker.lookup(name)  # a plain topic: point at its owner
        return pb.LookupResponse(partitions=partitions, broker_url=url)

    # -- publish ---------------------------------------------------------------------------------------------
    @bidi_stream
    async def Publish(self, requests: AsyncIterator[pb.PublishRequest], context: Ctx) -> AsyncIterator[Any]:
        it = requests.__aiter__()
        first = await _first(it, "open")
        opened = first.open
        if opened.schema_subject:
            await self.broker.schemas.check_producer(opened.topic, opened.schema_subject)
        session = await self.broker.producer_session(
            opened.topic, opened.producer_name, reliable=reliable_from_wire(opened.delivery, "delivery")
        )
        if opened.schema_subject:  # as danube's CreateProducer: an unbound topic takes the producer's subject
            await self.broker.schemas.attach_producer(session.topic, opened.schema_subject)
        topic = await self.broker.get_topic(TopicName.parse(session.topic))
        session.connected(_peer(context))
        yield pb.PublishResponse(
            opened=pb.PublishOpened(
                producer_id=session.id,
                max_inflight_batches=MAX_INFLIGHT_BATCHES,
                max_batch_bytes=MAX_BATCH_BYTES,
                max_batch_count=MAX_BATCH_COUNT,
                dictionary_id=_dictionary_of(topic),
            )
        )
        # The reader validates and starts each append in arrival order; this generator answers in the same
        # order once each is durable. The bounded queue is the flow control: a full one stops the reader,
        # which stops reading the stream, which makes HTTP/2 push back on the client.
        pending: asyncio.Queue[tuple[int, int, asyncio.Future[int]] | BaseException | None] = asyncio.Queue(
            MAX_INFLIGHT_BATCHES
        )
        reader = asyncio.create_task(self._publish_reader(it, session, topic, pending))
        session.attached += 1  # a producer with an open stream is never forgotten as idle
        try:
            while True:
                item = await pending.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                sequence, count, done = item
                first_offset = await done
                ack = pb.PublishAck(
                    sequence=sequence,
                    first_offset=first_offset,
                    count=count,
                    dictionary_id=_dictionary_of(topic),
                )
                yield pb.PublishResponse(ack=ack)
        finally:
            session.attached -= 1
            session.touch()
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader

    async def _publish_reader(
        self,
        it: AsyncIterator[pb.PublishRequest],
        session: ProducerSession,
        topic: Topic,
        pending: asyncio.Queue[tuple[int, int, asyncio.Future[int]] | BaseException | None],
    ) -> None:
        last_sequence = -1
        try:
            async for request in it:
                started = await self._start_append(request, last_sequence, session, topic)
                # Nothing of the request may stay referenced while the stream waits or idles: with 1,000
                # producers that was the last batch of each, decoded (~0.4 KB a record) and as received.
                del request
                last_sequence = started[0]
                await pending.put(started)
            await pending.put(None)
        except IsterError as exc:
            await pending.put(exc)
        except Exception as exc:  # a broken stream: end the response side too
            await pending.put(exc)

    async def _start_append(
        self, request: pb.PublishRequest, last_sequence: int, session: ProducerSession, topic: Topic
    ) -> tuple[int, int, asyncio.Future[int]]:
        """Validate one PublishBatch frame and start its append: (sequence, records, the append's future).
        The decoded records are dropped on return; the append keeps only the records' bytes."""
        if request.WhichOneof("kind") != "batch":
            raise InvalidArgument("only PublishBatch frames may follow PublishOpen")
        batch = request.batch
        if batch.sequence <= last_sequence:
            raise InvalidArgument(f"batch sequence {batch.sequence} is not above {last_sequence}")
        plain, stored = unpack_compressed(batch, MAX_BATCH_BYTES)
        raws, messages, nbytes, checked = decode_batch(
            batch, session, topic.max_message_size, messages=not topic.reliable, plain=plain
        )
        records: Sequence[bytes | msgspec.Raw] = raws
        if stored is not None and topic.reliable:  # stored as the producer compressed them
            records = stored
        await self.validator.check(session.topic, checked)
        if stored is not None and topic.compression is not None:  # a dictionary learns from plain records
            topic.compression.sample(raws)
        await topic.admit(len(raws), nbytes)  # a publish rate limit holds the stream here (back-pressure)
        session.sent(len(raws), nbytes)
        dedup = topic.dedup
        if batch.producer_key and dedup is not None:  # idempotent: a retry gets its original offsets
            done = idempotent_append(topic, dedup, batch, records, messages, nbytes)
        else:
            done = asyncio.ensure_future(topic.publish_batch(records, messages, nbytes))
        # Looked at even when the stream ends before its answer is sent (an earlier batch failed, the
        # client went away): otherwise asyncio logs "Task exception was never retrieved" for it.
        done.add_done_callback(_seen)
        return batch.sequence, len(raws), done

    # -- consume ---------------------------------------------------------------------------------------------
    @bidi_stream
    async def Consume(self, requests: AsyncIterator[pb.ConsumeRequest], context: Ctx) -> AsyncIterator[Any]:
        it = requests.__aiter__()
        first = await _first(it, "open")
        o = first.open
        sub_type = sub_type_from_wire(o.subscription_type)
        if o.window > MAX_WINDOW:
            raise InvalidArgument(f"window {o.window} is above {MAX_WINDOW}")
        earliest = initial_position_from_wire(o.initial_position)
        consumer_id = await self.broker.subscribe(
            o.topic, o.subscription, o.consumer_name, sub_type, list(o.key_filters), earliest
        )
        ref, stream = await self.broker.open_stream(consumer_id)
        ref.session.address = _peer(context)
        sub = ref.subscription
        if o.window:
            sub.set_window(o.window)
        acks = SubAcks(sub, consumer_id)
        acker = asyncio.create_task(self._consume_reader(it, acks, stream))
        try:
            opened = pb.ConsumeOpened(consumer_id=consumer_id, window=sub.window, cursor_epoch=acks.epoch)
            yield pb.ConsumeResponse(opened=opened)
            accept, dicts = o.accept_compressed, o.accept_dictionaries
            while True:
                frame, count = await _next_frame(stream, accept, dicts)
                if count == 0:
                    _raise_bad_request(acker)
                    return
                yield pb.ConsumeResponse(batch=pb.MessageBatch(frames=frame, count=count))
                # A consumer that has caught up must not hold its last frame (up to CHUNK_MAX_BYTES) while it
                # waits for the next one: 1,000 of them idle after a backlog held about 1 GB that way.
                del frame
        finally:
            acker.cancel()
            with contextlib.suppress(BaseException):
                await acker
            self.broker.close_stream(ref, stream)

    async def _consume_reader(
        self, it: AsyncIterator[pb.ConsumeRequest], acks: SubAcks, stream: ConsumerStream
    ) -> None:
        try:
            async for request in it:
                kind = request.WhichOneof("kind")
                if kind == "ack":
                    await acks.ack(request.ack)
                elif kind == "nack":
                    await acks.nack(request.nack)
                else:
                    raise InvalidArgument("only Ack and Nack frames may follow ConsumeOpen")
        except (asyncio.CancelledError, Exception):
            stream.end()  # a broken or bad request stream ends the response stream too
            raise
        # The client half-closed: it is leaving, and every ack it sent is applied. End the stream now, so
        # what is still in flight to it is redelivered at once and nothing it acknowledged is.
        stream.end()

    # -- offset reads ----------------------------------------------------------------------------------------
    @unary
    async def Offsets(self, request: pb.OffsetsRequest, context: Ctx) -> pb.OffsetsResponse:
        found = await self.broker.stored_offsets(request.topic)
        return pb.OffsetsResponse(
            earliest=found.earliest,
            next=found.next,
            durable_url=found.durable_url or "",
            object_prefix=found.object_prefix,
        )

    @unary
    async def SetCursor(self, request: pb.SetCursorRequest, context: Ctx) -> pb.SetCursorResponse:
        lag = await self.broker.set_cursor(request.topic, request.subscription, request.next)
        return pb.SetCursorResponse(lag=lag)

    @unary
    async def GetCompressionDictionary(
        self, request: pb.GetCompressionDictionaryRequest, context: Ctx
    ) -> pb.GetCompressionDictionaryResponse:
        return get_dictionary(request, self.broker.retention_view.cache)

    @unary
    async def SeekCursor(self, request: pb.ResetCursorRequest, context: Ctx) -> pb.ResetCursorResponse:
        move = await self.broker.seek_cursor(
            request.topic,
            request.subscription,
            position_from_wire(request),
            create=True,
            dry_run=request.dry_run,
        )
        return pb.ResetCursorResponse(positions=[move_to_wire(move)])

    @server_stream
    async def Read(self, request: pb.ReadRequest, context: Ctx) -> AsyncIterator[Any]:
        max_records = min(request.max_records or READ_DEFAULT_RECORDS, MAX_READ_RECORDS)
        batches = self.broker.read_range(
            request.topic, request.start, request.end, max_records, READ_MAX_BYTES
        )
        try:
            accept, dicts = request.accept_compressed, request.accept_dictionaries
            async for records in batches:
                yield pb.MessageBatch(frames=pack_frames(records, accept, dicts), count=len(records))
        finally:
            await batches.aclose()


class SubAcks:
    """Applies Ack/Nack frames to one consumer's subscription, validating ranges."""

    def __init__(self, sub: Any, consumer_id: int) -> None:
        self.sub = sub
        self.consumer_id = consumer_id
        # A cursor reset changes the subscription's epoch and ends this stream: acks still arriving on it
        # were for messages of the old position and must not move the new cursor.
        self.epoch: int = sub.epoch

    @staticmethod
    def _ranges(ranges: Any) -> list[tuple[int, int]]:
        if len(ranges) > MAX_ACK_RANGES:
            raise InvalidArgument(f"more than {MAX_ACK_RANGES} ranges in one frame")
        out = []
        for r in ranges:
            if r.first > r.last:
                raise InvalidArgument(f"bad offset range {r.first}..{r.last}")
            out.append((r.first, r.last))
        return out

    async def ack(self, ack: pb.Ack) -> None:
        if self.sub.epoch != self.epoch:
            return
        for first, last in self._ranges(ack.ranges):
            await self.sub.ack_range(first, last, self.consumer_id)
        if ack.HasField("upto"):
            await self.sub.ack_upto(ack.upto, self.consumer_id)

    async def nack(self, nack: pb.Nack) -> None:
        reason = nack.reason if nack.HasField("reason") else None
        if reason is not None and len(reason.encode()) > MAX_NACK_REASON_BYTES:
            raise InvalidArgument(f"nack reason is longer than {MAX_NACK_REASON_BYTES} bytes")
        delay = nack.delay_ms if nack.HasField("delay_ms") else None
        if self.sub.epoch != self.epoch:
            return
        for first, last in self._ranges(nack.ranges):
            await self.sub.nack_range(first, last, self.consumer_id, delay, reason)


def _raise_bad_request(acker: asyncio.Task[None]) -> None:
    """The response stream ended: when a bad Ack/Nack frame ended it, end the call with that error."""
    if acker.done() and not acker.cancelled():
        exc = acker.exception()
        if isinstance(exc, IsterError):
            raise exc


async def _first(it: AsyncIterator[Any], kind: str) -> Any:
    try:
        request = await asyncio.wait_for(anext(it), OPEN_TIMEOUT_SECONDS)
    except StopAsyncIteration:
        raise InvalidArgument("the stream ended before its open frame") from None
    except TimeoutError:
        raise InvalidArgument(f"no open frame within {OPEN_TIMEOUT_SECONDS:.0f} s") from None
    if request.WhichOneof("kind") != kind:
        raise InvalidArgument(f"the first frame must be {kind!r}")
    return request


async def _next_frame(stream: ConsumerStream, accept: bool = True, dicts: bool = False) -> tuple[bytes, int]:
    """Wait for at least one message, then take what is queued (bounded) as one frame of WAL frames. Chunks of
    frames read from the durable tier go as they are; single records are framed here. Not `accept`: every
    compressed record goes decompressed (a consumer that cannot decode them); with `accept` but not
    `dicts`, those compressed with a zstd dictionary (ister_compressed.py)."""
    item = await stream.get()
    if item is None:
        return b"", 0
    pack = HEADER.pack
    parts: list[Any] = []
    count = size = 0
    while True:
        if isinstance(item, OutChunk):
            if item.block is not None:
                parts.append(client_frames(item.block.frames(), accept, dicts))
            else:
                assert item.records is not None
                for offset, record in zip(item.offsets, item.records, strict=True):
                    out = client_record(record, accept, dicts)
                    parts.append(pack(offset, len(out), crc32c(out)))
                    parts.append(out)
            count += item.count
            size += item.nbytes
        else:
            out = client_record(item.record, accept, dicts)
            parts.append(pack(item.offset, len(out), crc32c(out)))
            parts.append(out)
            count += 1
            size += HEADER_SIZE + len(item.record)
        nxt = stream.peek()
        if nxt is None:
            break
        if isinstance(nxt, OutChunk):
            n, nbytes = nxt.count, nxt.nbytes
        else:
            n, nbytes = 1, HEADER_SIZE + len(nxt.record)
        if count + n > MAX_FRAME_MESSAGES or size + nbytes > MAX_FRAME_BYTES:
            break
        item = stream.pop()
    return b"".join(parts), count


def pack_frames(records: list[tuple[int, bytes]], accept: bool = True, dicts: bool = False) -> bytes:
    """(offset, record) pairs as back-to-back WAL frames (the MessageBatch layout); not `accept`: compressed
    records decompressed (with `accept` but not `dicts`: those with a zstd dictionary)."""
    pack = HEADER.pack
    parts: list[bytes | memoryview] = []
    for offset, stored in records:
        record = client_record(stored, accept, dicts)
        parts.append(pack(offset, len(record), crc32c(record)))
        parts.append(record)
    return b"".join(parts)


def add_ister_service(server: Any, broker: BrokerService, api_keys: ApiKeyStore | None = None) -> None:
    add_service(server, IsterServicer(broker, api_keys), pb, "Ister")


def _dictionary_of(topic: Topic) -> int:
    """The zstd dictionary a producer of `topic` may compress with (0: none; see PublishOpened)."""
    policy = topic.compression
    return policy.dictionary() if policy is not None else 0


def _seen(future: asyncio.Future[int]) -> None:
    if not future.cancelled():
        future.exception()
