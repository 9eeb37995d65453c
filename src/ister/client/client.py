"""The Ister client: one object per broker cluster, creating producers and consumers.

It talks the Ister batch API (`ister.v1.Ister`: Lookup, Publish, Consume, Offsets, Read), which carries
many messages per stream frame. Channels are shared per broker URL. Topic lookups go to the service URL;
each stream then connects to the broker the lookup names (and looks up again after a failure, so a topic
that moved is found). Errors are the classes of `ister.errors`, carrying the broker's message.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any, TypeVar

import grpc

from ister import errors
from ister.client._conn import RetryBudget
from ister.client.connection import ClientConnection
from ister.client.consumer import Consumer, SubType
from ister.client.cursors import TIME_LOOKUP_SUBSCRIPTION, CursorPosition, SeekPosition, seek_request
from ister.client.cursors import seek as seek_cursor
from ister.client.messages import split_frames
from ister.client.producer import Producer
from ister.client.publisher import PartitionPublisher
from ister.client.records import new_producer_key
from ister.client.subscriber import Subscriber
from ister.core.compression import parse_codec
from ister.ids import PARTITION_MARKER, TopicName, validate_client_name
from ister.limits import MAX_READ_OFFSET, MAX_READ_RECORDS, MAX_WINDOW, U64_MAX, MiB
from ister.wire.gen import ister_v1_pb2 as pb

T = TypeVar("T")
INITIAL_POSITIONS = {"latest": 0, "earliest": 1}  # ConsumeOpen.initial_position

OFFSETS_TIMEOUT_SECONDS = 60.0  # one Offsets call (the owner may have to load the topic first)
READ_BATCH_TIMEOUT_SECONDS = 60.0  # one response of a Read stream (the owner reads at most 64 MiB for it)

_SUB_TYPES = {
    "exclusive": SubType.EXCLUSIVE,
    "shared": SubType.SHARED,
    "failover": SubType.FAILOVER,
    # On a partitioned topic a Failover subscription spreads the partitions over its consumers (one consumer
    # per partition at a time, moved by graceful handoff); `partitioned` names that use.
    "partitioned": SubType.FAILOVER,
    "key_shared": SubType.KEY_SHARED,
    "key-shared": SubType.KEY_SHARED,
}


@dataclass(frozen=True, slots=True)
class TopicOffsets:
    """The stored offsets of a reliable topic: `earliest` .. `next - 1` (`next` is the offset the next
    published message gets; equal to `earliest` when nothing is stored). `durable_url` is the broker's
    durable object store (None without one) and `object_prefix` the key prefix of this topic's
    `data-<first>-<last>.dnb1` objects relative to it."""

    topic: str
    earliest: int
    next: int
    durable_url: str | None
    object_prefix: str


def _sub_type(value: str | int | SubType) -> SubType:
    if isinstance(value, str):
        try:
            return _SUB_TYPES[value.lower()]
        except KeyError:
            raise errors.InvalidArgument(f"unknown subscription type {value!r}") from None
    try:
        return SubType(int(value))
    except ValueError:
        raise errors.InvalidArgument(f"unknown subscription type {value!r}") from None


class Client(ClientConnection):
    """Connection to an Ister cluster. Use as `async with Client(url) as client:` or call `close()`.

    Every call has a deadline. `connect_timeout` bounds each attempt to look a topic up (a seed that
    refuses connections, or does not answer within its share, is skipped for the next; one that answers,
    even UNAVAILABLE, is kept) and to open a stream on the topic's owner
    (an owner that cannot be reached fails the attempt at once). A failed attempt is retried with
    exponential backoff with jitter (`backoff_base`, `backoff_max`), looking the topic up again each
    time, so a topic whose owner died is found on its new owner once the cluster has reassigned it
    (the dead owner's lease TTL plus about a second). A series of retries ends `retry_timeout` seconds
    after its first failure (or after `max_retries` retries, when set); then the typed error (usually
    Unavailable, naming the topic) reaches the caller: a producer's pending sends fail with it.

    `connect()` waits up to `connect_timeout` for a broker that refuses connections (it may be starting);
    with `wait_for_broker=False` a refused (or otherwise failed) connection fails at once, naming the
    address (the `ister` command line: a person at a terminal should not wait 10 s for a typo)."""

    # -- offset reads (reliable topics, no subscription) ----------------------------------------------------
    async def offsets(self, topic: str) -> TopicOffsets:
        """The stored offset range of a reliable topic and where its durable objects are. `topic` is a
        concrete topic (a partition topic `<topic>-part-N` of a partitioned one). FailedPrecondition for a
        non-reliable topic, NotFound for an unknown one."""
        TopicName.parse(topic)
        request = pb.OffsetsRequest(topic=topic)

        async def call(stub: Any) -> Any:
            return await stub.Offsets(request, timeout=OFFSETS_TIMEOUT_SECONDS)

        resp = await self._on_owner(topic, call, "Offsets")
        return TopicOffsets(
            topic, int(resp.earliest), int(resp.next), resp.durable_url or None, resp.object_prefix
        )

    async def seek(self, topic: str, subscription: str, position: SeekPosition) -> list[CursorPosition]:
        """Move `subscription` (every partition of a partitioned `topic`) to `position`: an offset, a
        publish time (`datetime`: the first message published at or after it), "earliest" or "latest".
        Works while consumers are attached: the broker moves them (their streams reconnect and receive from
        the new position). Creates the subscription if it does not exist. InvalidArgument for an offset
        past a partition's head (checked per partition: earlier partitions have moved by then)."""
        found = await self.lookup_with_retry(topic)
        if found is None:
            raise errors.NotFound(f"topic {topic} does not exist")
        names = found.partitions or [topic]
        return [await seek_cursor(self, part, subscription, position) for part in names]

    async def offset_for_time(self, topic: str, when: datetime | int) -> int:
        """The first offset of the concrete `topic` (a partition of a partitioned one) whose message was
        published at or after `when` (a datetime, or Unix ms), else its head. Nothing moves (a dry-run
        SeekCursor on a name no subscription uses)."""
        request = seek_request(topic, TIME_LOOKUP_SUBSCRIPTION, when if isinstance(when, datetime) else 0)
        if not isinstance(when, datetime):
            if isinstance(when, bool) or when < 0:
                raise errors.InvalidArgument(f"bad time {when!r}: Unix milliseconds >= 0 or a datetime")
            request.time_ms = when
        request.dry_run = True

        async def call(stub: Any) -> Any:
            return await stub.SeekCursor(request, timeout=OFFSETS_TIMEOUT_SECONDS)

        return int((await self._on_owner(topic, call, "SeekCursor")).positions[0].next)

    async def set_cursor(self, topic: str, subscription: str, next_offset: int) -> int:
        """Move `subscription`'s cursor on a reliable topic so that `next_offset` is the first offset it has
        not consumed (creating the subscription if needed), for readers that keep their own position and
        want their lag visible on the broker; returns the lag. FailedPrecondition while consumers are
        attached to the subscription, InvalidArgument when `next_offset` is past the head."""
        TopicName.parse(topic)
        if not 0 <= next_offset <= MAX_READ_OFFSET:
            raise errors.InvalidArgument(f"bad offset {next_offset}: need 0 <= offset <= 2^63")
        request = pb.SetCursorRequest(topic=topic, subscription=subscription, next=next_offset)

        async def call(stub: Any) -> Any:
            return await stub.SetCursor(request, timeout=OFFSETS_TIMEOUT_SECONDS)

        return int((await self._on_owner(topic, call, "SetCursor")).lag)

    async def read(
        self, topic: str, start: int, end: int, *, max_records: int = 10_000
    ) -> AsyncIterator[list[tuple[int, bytes]]]:
        """The stored records of a reliable topic with offsets in [start, end), in offset order, in batches
        of at most `max_records` (offset, record) pairs. A record is the msgpack record as stored
        (decompressed when stored compressed; `ister.core.record.decode_message` decodes it); its CRC-32C
        was checked.

        Never waits for new messages: it ends at `end` or at the topic's head (`offsets().next`) when the
        read (or, after a retry, the retried read) started, whichever is lower. Offsets that are not stored
        are absent. Retriable failures (the topic moved, the broker restarted) are retried on the topic's
        owner from the offset after the last one yielded, so no record is lost or repeated.
        InvalidArgument unless 0 <= start <= end <= 2^63."""
        TopicName.parse(topic)
        if not 0 <= start <= end <= MAX_READ_OFFSET:
            raise errors.InvalidArgument(f"bad offset range [{start}, {end}): need 0 <= start <= end <= 2^63")
        if not 1 <= max_records <= MAX_READ_RECORDS:
            raise errors.InvalidArgument(f"max_records must be in 1..{MAX_READ_RECORDS}")
        at = start  # the next offset wanted
        budget = RetryBudget(self.retry)
        while at < end:
            try:
                stub = await self.stub_for(topic)
                request = pb.ReadRequest(
                    topic=topic,
                    start=at,
                    end=end,
                    max_records=max_records,
                    accept_compressed=True,
                    accept_dictionaries=True,  # fetched on demand (client/dictionaries.py)
                )
                call = stub.Read(request)
                try:
                    while True:
                        try:
                            async with asyncio.timeout(READ_BATCH_TIMEOUT_SECONDS):
                                batch = await call.read()
                        except TimeoutError:
                            raise errors.Timeout(
                                f"{topic}: no Read response within {READ_BATCH_TIMEOUT_SECONDS:g} s"
                            ) from None
                        if batch is grpc.aio.EOF:
                            break
                        offsets, records = await self.dictionaries.decode(
                            topic, partial(split_frames, batch.frames, batch.count)
                        )
                        if not offsets:
                            continue
                        if (
                            offsets[0] < at
                            or offsets[-1] >= end
                            or any(map(int.__ge__, offsets, offsets[1:]))
                        ):
                            raise errors.CorruptionError(
                                f"{topic}: Read returned offsets {offsets[0]}..{offsets[-1]} out of order or "
                                f"outside [{at}, {end})"
                            )
                        at = offsets[-1] + 1
                        budget.reset()  # progress: a later failure is a fresh one
                        yield list(zip(offsets, map(bytes, records), strict=True))
                finally:
                    call.cancel()
                return
            except Exception as exc:
                await self._retry_or_raise(exc, budget, f"{topic}: Read from offset {at}")

    # -- producers and consumers ----------------------------------------------------------------------------
    async def producer(
        self,
        topic: str,
        name: str | None = None,
        *,
        reliable: bool = True,
        linger_ms: float = 2.0,
        max_batch_messages: int = 4096,
        max_batch_bytes: int = 1 * MiB,
        max_inflight_batches: int | None = None,
        partitions: int | None = None,
        max_buffered_messages: int = 262_144,
        max_buffered_bytes: int = 64 * MiB,
        schema_subject: str | None = None,
        schema_version: int | None = None,
        schema_min_version: int | None = None,
        idempotent: bool = True,
        compression: str = "none",
        producer_key: int | None = None,
    ) -> Producer:
        """A producer on `topic`, its stream(s) open when this returns.

        A missing topic is created by the first producer (reliable or not, as asked). `partitions=N` creates
        `<topic>-part-0 .. -part-N-1` when the topic does not exist yet; an existing partitioned topic is used
        with its own partitions. `max_inflight_batches=None` uses the broker's limit; batch limits are the
        smaller of these and the broker's. `schema_subject` stamps every message with the subject's id and
        its latest version, or `schema_version` (pinned), or the latest if at least `schema_min_version`;
        `producer.schema` is then the resolved version (its `schema` validates and decodes).
        `idempotent` (default): a retried batch is stored once (docs/idempotence.md); False: at-least-once.
        `compression`: none, lz4, zstd, snappy or gzip; each record is sent and stored compressed with it
        (docs/compression.md; "none" lets the topic's compression policy decide).
        `producer_key`: the idempotence key chosen by the caller instead of a random one, for sends that are
        repeated by another producer object with the same batches (`Producer.send_whole`): the repeat is
        stored once; such a producer stops at its first failure (every later send fails)."""
        TopicName.parse(topic)
        codec = parse_codec(compression)
        if name is not None:
            validate_client_name(name, "producer name")
        if max_batch_messages < 1 or max_batch_bytes < 1024 or max_buffered_messages < 1:
            raise errors.InvalidArgument("batch and buffer limits must be positive (max_batch_bytes >= 1024)")
        if partitions is not None and not 1 <= partitions <= 100_000:
            raise errors.InvalidArgument("partitions must be in 1..100000")
        if linger_ms < 0:
            raise errors.InvalidArgument("linger_ms must be >= 0")
        if producer_key is not None and not (idempotent and 0 < producer_key <= U64_MAX):
            raise errors.InvalidArgument(
                f"producer_key must be in 1..2**64-1 with idempotent=True, got {producer_key}"
            )
        name = name or f"ister-producer-{secrets.token_hex(6)}"
        resolved = None
        if schema_subject is not None:
            resolved = await self.schemas.resolve(
                schema_subject, version=schema_version, min_version=schema_min_version
            )
        found = await self.lookup_with_retry(topic)
        names = found.partitions if found is not None and found.partitions else [topic]
        if partitions and names == [topic] and TopicName.parse(topic).partition is None:
            names = [f"{topic}{PARTITION_MARKER}{i}" for i in range(partitions)]
        producer = Producer(
            self,
            topic,
            name,
            max_batch_bytes=max_batch_bytes,
            max_buffered_messages=max_buffered_messages,
            max_buffered_bytes=max(max_buffered_bytes, max_batch_bytes),
        )

        # one per producer object, unless given; sequences per partition
        key = producer_key or (new_producer_key() if idempotent else 0)

        def on_seal(index: int) -> Any:
            return lambda: producer._on_seal(index)

        pubs = [
            PartitionPublisher(
                self,
                part,
                name,
                reliable=reliable,
                linger=linger_ms / 1000,
                max_batch_messages=max_batch_messages,
                max_batch_bytes=max_batch_bytes,
                max_inflight=max_inflight_batches,
                on_seal=on_seal(i),
                on_release=producer._on_release,
                producer_key=key,
                codec=codec,
                fixed_key=producer_key is not None,
            )
            for i, part in enumerate(names)
        ]
        if resolved is not None:
            producer.schema = resolved
            for p in pubs:
                p.schema = (resolved.schema_id, resolved.version)
                p.schema_subject = schema_subject or ""
        producer._attach(pubs)
        results = await asyncio.gather(*(p.start() for p in pubs), return_exceptions=True)
        failure = next((r for r in results if isinstance(r, BaseException)), None)
        if failure is not None:
            await asyncio.gather(*(p.close() for p in pubs), return_exceptions=True)
            raise failure
        self._owned.add(producer)
        return producer

    async def consumer(
        self,
        topic: str,
        subscription: str,
        *,
        type: str | int | SubType = "exclusive",  # the natural keyword for users
        name: str | None = None,
        key_filters: tuple[str, ...] | list[str] = (),
        window: int = 1000,
        initial_position: str = "latest",
    ) -> Consumer:
        """A consumer of `subscription` on `topic` (every partition of a partitioned topic), subscribed when
        this returns. A subscription created now starts at `initial_position`: "latest" (the default, as
        Danube: only messages published from now on) or "earliest" (every stored message); an existing
        subscription keeps its cursor. `window` is the number of unacknowledged messages the broker may
        deliver (1..10000, per partition). NotFound when the topic does not exist."""
        TopicName.parse(topic)
        validate_client_name(subscription, "subscription name")
        if name is not None:
            validate_client_name(name, "consumer name")
        if not 1 <= window <= MAX_WINDOW:
            raise errors.InvalidArgument(f"window must be in 1..{MAX_WINDOW}")
        sub_type = _sub_type(type)
        position = INITIAL_POSITIONS.get(initial_position)
        if position is None:
            raise errors.InvalidArgument(
                f"initial_position must be 'latest' or 'earliest', not {initial_position!r}"
            )
        name = name or f"ister-consumer-{secrets.token_hex(6)}"
        found = await self.lookup_with_retry(topic)
        names = found.partitions if found is not None and found.partitions else [topic]
        consumer = Consumer(self, topic, subscription, name)
        subs = [
            Subscriber(
                self,
                part,
                subscription,
                name,
                int(sub_type),
                tuple(key_filters),
                window,
                consumer.queue,
                initial_position=position,
            )
            for part in names
        ]
        consumer._attach(subs)
        results = await asyncio.gather(*(s.start() for s in subs), return_exceptions=True)
        failure = next((r for r in results if isinstance(r, BaseException)), None)
        if failure is not None:
            await asyncio.gather(*(s.close() for s in subs), return_exceptions=True)
            raise failure
        self._owned.add(consumer)
        return consumer
