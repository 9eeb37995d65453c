"""A FAKE in-process `ister.v1.Ister` broker for the client's unit tests.

Why a fake: the unit tests check the client's own logic — batching and linger, flow control, ordered acks,
retry/backoff, reconnect with re-send, ack coalescing, redelivery handling — deterministically and fast,
with failures injected exactly where a test wants them (drop the stream after the n-th batch, lose an ack,
reject one batch, restart the server). The real broker is exercised by tests/integration/test_client_*.py.

The fake keeps everything in memory: per topic a list of records (offset = index), per subscription the
delivered-but-unacked offsets, which are redelivered when the consumer's stream re-opens or on a nack.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import msgspec

from ister.core.frames import encode_frame
from ister.core.record import StoredMessage
from ister.errors import InvalidArgument
from ister.ids import TopicName
from ister.wire.gen import ister_v1_pb2 as pb
from ister.wire.gen import ister_v1_pb2_grpc as pb_grpc
from tests.support import free_port

_decode_records = msgspec.msgpack.Decoder(list[msgspec.Raw]).decode
_decode_record = msgspec.msgpack.Decoder(StoredMessage).decode


@dataclass
class SubState:
    next_offset: int
    window: int = 1000
    unacked: set[int] = field(default_factory=set)
    redeliver: list[int] = field(default_factory=list)
    consumer_id: int = 0
    ack_frames: int = 0
    acked: set[int] = field(default_factory=set)
    nacked: list[int] = field(default_factory=list)

    def apply(self, req: Any) -> None:
        """An Ack or Nack frame from the consumer (anything else is ignored)."""
        kind = req.WhichOneof("kind")
        if kind == "ack":
            self.ack_frames += 1
            for r in req.ack.ranges:
                for off in range(r.first, r.last + 1):
                    self.unacked.discard(off)
                    self.acked.add(off)
            if req.ack.HasField("upto"):
                for off in [x for x in self.unacked if x <= req.ack.upto]:
                    self.unacked.discard(off)
                    self.acked.add(off)
        elif kind == "nack":
            for r in req.nack.ranges:
                for off in range(r.first, r.last + 1):
                    if off in self.unacked:
                        self.nacked.append(off)
                        self.redeliver.append(off)

    def next_delivery(self, stored: int) -> list[int]:
        """The offsets to send next within the window: redeliveries first, then new records (not yet
        marked unacked)."""
        room = self.window - len(self.unacked - set(self.redeliver))
        out: list[int] = []
        while self.redeliver and len(out) < max(room, 0):
            out.append(self.redeliver.pop(0))
        while self.next_offset < stored and len(out) < room:
            out.append(self.next_offset)
            self.next_offset += 1
        return out


class FakeIster(pb_grpc.IsterServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self.records: dict[str, list[bytes]] = {}
        self.partitioned: dict[str, list[str]] = {}
        self.subs: dict[tuple[str, str], SubState] = {}
        self.producer_ids: dict[tuple[str, str], int] = {}
        self.max_inflight = 8
        self.max_batch_bytes = 4 * 1024 * 1024
        self.max_batch_count = 10_000
        self.ack_delay = 0.0
        self.batches: list[tuple[str, int]] = []  # (topic, count) per stored batch
        self.opens = 0
        self.consume_opens = 0
        self.max_unacked_batches = 0
        # Failure injection: called with (topic, batch index on this stream, decoded messages).
        # Return a grpc.StatusCode to end the stream with it; "store-then-drop" stores the batch and then
        # drops the stream before its ack (a lost ack).
        self.on_batch: Callable[[str, int, list[StoredMessage]], Any] | None = None
        self.wake = asyncio.Event()

    # -- lookup ------------------------------------------------------------------------------------------
    async def Lookup(self, request: Any, context: Any) -> Any:
        topic = request.topic
        if topic in self.partitioned:
            return pb.LookupResponse(partitions=self.partitioned[topic], broker_url="")
        if topic not in self.records:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"topic {topic} does not exist")
        return pb.LookupResponse(partitions=[topic], broker_url="")

    def _check_topic(self, topic: str) -> tuple[grpc.StatusCode, str] | None:
        try:
            name = TopicName.parse(topic)
        except InvalidArgument as exc:
            return grpc.StatusCode.INVALID_ARGUMENT, str(exc)
        if name.namespace != "default":
            return grpc.StatusCode.NOT_FOUND, f"namespace {name.namespace!r} does not exist"
        return None

    # -- publish -----------------------------------------------------------------------------------------
    async def Publish(self, request_iterator: Any, context: Any) -> None:
        first = await context.read()
        self.opens += 1
        topic = first.open.topic
        bad = self._check_topic(topic)
        if bad:
            await context.abort(*bad)
        part = TopicName.parse(topic).partition
        if part is not None:
            base = f"/default/{part[0]}"
            parts = self.partitioned.setdefault(base, [])
            if topic not in parts:
                parts.append(topic)
                parts.sort(key=lambda t: int(t.rsplit("-", 1)[1]))
        store = self.records.setdefault(topic, [])
        pid = self.producer_ids.setdefault((topic, first.open.producer_name), len(self.producer_ids) + 1)
        await context.write(
            pb.PublishResponse(
                opened=pb.PublishOpened(
                    producer_id=pid,
                    max_inflight_batches=self.max_inflight,
                    max_batch_bytes=self.max_batch_bytes,
                    max_batch_count=self.max_batch_count,
                )
            )
        )
        pending: asyncio.Queue[tuple[int, int, int] | None] = asyncio.Queue()
        unacked = [0]

        async def acker() -> None:
            while True:
                item = await pending.get()
                if item is None:
                    return
                if self.ack_delay:
                    await asyncio.sleep(self.ack_delay)
                seq, first_offset, count = item
                await context.write(
                    pb.PublishResponse(
                        ack=pb.PublishAck(sequence=seq, first_offset=first_offset, count=count)
                    )
                )
                unacked[0] -= 1

        task = asyncio.create_task(acker())
        index = 0
        try:
            while True:
                req = await context.read()
                if req is grpc.aio.EOF:
                    break
                b = req.batch
                raws = _decode_records(b.records)
                msgs = [_decode_record(r) for r in raws]
                assert len(msgs) == b.count
                assert all(m.producer_id == pid and m.producer_name == first.open.producer_name for m in msgs)
                verdict = self.on_batch(topic, index, msgs) if self.on_batch else None
                index += 1
                if isinstance(verdict, grpc.StatusCode):
                    await pending.put(None)
                    await task  # acks of every earlier batch go out first
                    await context.abort(verdict, f"injected {verdict.name}")
                first_offset = len(store)
                store.extend(bytes(r) for r in raws)
                self.batches.append((topic, len(msgs)))
                self.wake.set()
                self.wake = asyncio.Event()
                if verdict == "store-then-drop":
                    await pending.put(None)
                    await task
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "injected: ack lost")
                unacked[0] += 1
                self.max_unacked_batches = max(self.max_unacked_batches, unacked[0])
                await pending.put((b.sequence, first_offset, len(msgs)))
            await pending.put(None)
            await task
        finally:
            task.cancel()

    # -- consume -----------------------------------------------------------------------------------------
    async def Consume(self, request_iterator: Any, context: Any) -> None:
        first = await context.read()
        self.consume_opens += 1
        o = first.open
        bad = self._check_topic(o.topic)
        if bad:
            await context.abort(*bad)
        if o.topic not in self.records:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"topic {o.topic} does not exist")
        store = self.records[o.topic]
        key = (o.topic, o.subscription)
        sub = self.subs.get(key)
        if sub is None:
            sub = self.subs[key] = SubState(next_offset=len(store), consumer_id=len(self.subs) + 1)
        sub.window = o.window or 1000
        # Whatever was delivered and not acked goes out again on the new stream.
        sub.redeliver = sorted(sub.unacked | set(sub.redeliver))
        await context.write(
            pb.ConsumeResponse(opened=pb.ConsumeOpened(consumer_id=sub.consumer_id, window=sub.window))
        )
        poke = asyncio.Event()

        async def reader() -> None:
            while True:
                req = await context.read()
                if req is grpc.aio.EOF:
                    return
                sub.apply(req)
                poke.set()

        task = asyncio.create_task(reader())
        try:
            while not task.done():
                out = sub.next_delivery(len(store))
                if out:
                    sub.unacked.update(out)
                    frames = b"".join(encode_frame(off, store[off]) for off in out)
                    await context.write(
                        pb.ConsumeResponse(batch=pb.MessageBatch(frames=frames, count=len(out)))
                    )
                    continue
                poke.clear()
                wake = self.wake
                waits = [asyncio.ensure_future(poke.wait()), asyncio.ensure_future(wake.wait()), task]
                await asyncio.wait(waits, timeout=0.2, return_when=asyncio.FIRST_COMPLETED)
                for w in waits[:2]:
                    w.cancel()
        finally:
            task.cancel()


class FakeServer:
    """FakeIster on a fixed loopback port; `restart()` stops it (ending every stream) and starts again."""

    def __init__(self, servicer: FakeIster | None = None) -> None:
        self.servicer = servicer or FakeIster()
        self.port = free_port()
        self.server: Any = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self.server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        pb_grpc.add_IsterServicer_to_server(self.servicer, self.server)
        self.server.add_insecure_port(f"127.0.0.1:{self.port}")
        await self.server.start()

    async def stop(self) -> None:
        if self.server is not None:
            with contextlib.suppress(Exception):
                await self.server.stop(0)
            self.server = None

    async def restart(self, down_for: float = 0.0) -> None:
        await self.stop()
        if down_for:
            await asyncio.sleep(down_for)  # the broker is down for a while (not an assertion)
        await self.start()


def stored_messages(fake: FakeIster, topic: str) -> list[StoredMessage]:
    return [_decode_record(r) for r in fake.records.get(topic, [])]


def stored_payloads(fake: FakeIster, topic: str) -> list[bytes]:
    return [m.payload for m in stored_messages(fake, topic)]


async def test_fake_server_starts_and_stops() -> None:
    server = FakeServer()
    await server.start()
    await server.restart()
    await server.stop()
