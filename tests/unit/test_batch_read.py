"""The batch API's Offsets and Read, its per-record publish checks, and what idle Publish and Consume
streams (and a Danube ReceiveMessages stream) keep, against an in-process broker
(BrokerService + its client gRPC server, embedded metadata, the default `file://` durable tier under
tmp_path), driven through `ister.client`.

Exports are forced deterministically: `Wal.rotate`, `SegmentExporter.export_closed`, `Wal.drop_segments`.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import time
import tracemalloc
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import msgspec
import pytest

from ister import errors
from ister.broker.service import BrokerService
from ister.broker.topic import Topic
from ister.client import Client, TopicOffsets
from ister.config import load_config
from ister.core import record
from ister.core.record import decode_message
from ister.errors import MetadataError
from ister.ids import TopicName
from ister.metadata import keys
from ister.metadata.embedded import EmbeddedStore
from ister.storage.objects import list_descriptors, read_segment
from ister.wire.gen import ister_v1_pb2 as pb
from ister.wire.gen import ister_v1_pb2_grpc as pb_grpc
from tests.support import free_port, until
from tests.unit.isolation import run_module_in_child, skip_if_sharing, start_client_server


@pytest.fixture(autouse=True)
def _own_process(request: pytest.FixtureRequest) -> None:
    skip_if_sharing(request)


def test_in_child_process() -> None:
    run_module_in_child(__file__)


Sent = tuple[int, bytes, dict[str, str], str | None]  # offset, payload, attributes, routing key


class Served:
    def __init__(self, broker: BrokerService, url: str) -> None:
        self.broker = broker
        self.url = url

    def topic(self, name: str) -> Topic:
        return self.broker.topics[name]


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    port = free_port()
    config = load_config(overrides={"broker_addr": f"127.0.0.1:{port}"}, environ={})
    store = EmbeddedStore.in_memory()
    broker = BrokerService(config, store, tmp_path)
    await broker.start()
    server = await start_client_server(broker, config.broker_addr)
    try:
        yield Served(broker, f"http://127.0.0.1:{port}")
    finally:
        await server.stop(0)
        await broker.close()
        await store.close()


async def publish(client: Client, topic: str, first: int, n: int) -> list[Sent]:
    """n messages with distinct payloads, attributes and (every other one) a routing key."""
    producer = await client.producer(topic, "p", linger_ms=0)
    sent: list[Sent] = []
    for i in range(first, first + n):
        payload, attrs, key = b"m%05d" % i, {"i": str(i), "k": "v"}, (f"key-{i}" if i % 2 else None)
        offset = await producer.send(payload, attributes=attrs, key=key)
        sent.append((offset, payload, attrs, key))
    await producer.close()
    return sent


async def read_all(
    client: Client, topic: str, start: int, end: int, **kw: Any
) -> list[list[tuple[int, bytes]]]:
    async with asyncio.timeout(20):  # a read must never wait for new messages
        return [batch async for batch in client.read(topic, start, end, **kw)]


def flat(batches: list[list[tuple[int, bytes]]]) -> list[tuple[int, bytes]]:
    return [r for b in batches for r in b]


def decoded(records: list[tuple[int, bytes]]) -> list[Sent]:
    out: list[Sent] = []
    for offset, raw in records:
        m = decode_message(raw)
        out.append((offset, m.payload, m.attributes, m.routing_key))
    return out


async def tiered_topic(served: Served, client: Client, topic: str) -> list[Sent]:
    """35 messages: 0..29 only in three durable objects (WAL files dropped), 30..34 only in the WAL."""
    sent: list[Sent] = []
    for part in range(3):
        sent += await publish(client, topic, 10 * part, 10)
        wal = served.topic(topic).wal
        assert wal is not None
        await wal.rotate()
    loaded = served.topic(topic)
    assert loaded.wal is not None and loaded.exporter is not None
    await loaded.exporter.export_closed()
    descriptors = await list_descriptors(served.broker.store, loaded.name)
    assert [(d.start_offset, d.end_offset) for d in descriptors] == [(0, 9), (10, 19), (20, 29)]
    closed = [path for _, path, _ in loaded.wal.segments()[:-1]]
    assert await loaded.wal.drop_segments(closed) == 3
    assert loaded.wal.first_offset == 30
    sent += await publish(client, topic, 30, 5)
    return sent


async def test_offsets_of_empty_and_non_empty_topics(served: Served) -> None:
    topic = "/default/offsets"
    async with Client(served.url) as client:
        producer = await client.producer(topic, "p")  # creates the reliable topic, publishes nothing
        assert served.broker.objects is not None
        url = served.broker.objects.url
        assert url.startswith("file://")
        assert await client.offsets(topic) == TopicOffsets(topic, 0, 0, url, "default/offsets")
        assert await read_all(client, topic, 0, 100) == []
        await producer.send_batch([b"a", b"b", b"c"])
        assert await client.offsets(topic) == TopicOffsets(topic, 0, 3, url, "default/offsets")


async def test_read_spans_objects_and_the_wal_tail(served: Served) -> None:
    topic = "/default/tiered"
    async with Client(served.url) as client:
        sent = await tiered_topic(served, client, topic)
        span = await client.offsets(topic)
        assert (span.earliest, span.next) == (0, 35)
        batches = await read_all(client, topic, span.earliest, span.next, max_records=4)
        assert all(1 <= len(b) <= 4 for b in batches)
        records = flat(batches)
        assert decoded(records) == sent  # offsets, payloads, attributes, routing keys
        # The records are the stored bytes: exactly what the objects hold.
        objects = served.broker.objects
        assert objects is not None
        stored: list[tuple[int, bytes]] = []
        for desc in await list_descriptors(served.broker.store, TopicName.parse(topic)):
            assert desc.key.startswith(span.object_prefix + "/")
            async for chunk in read_segment(objects, desc.key):
                stored += chunk
        assert stored == records[:30]
        # start inside the range, end exclusive (across the object/object and object/WAL boundaries)
        assert [o for o, _ in flat(await read_all(client, topic, 12, 33))] == list(range(12, 33))
        assert [o for o, _ in flat(await read_all(client, topic, 29, 31))] == [29, 30]
        assert flat(await read_all(client, topic, 7, 7)) == []
        # end beyond the head: stops at the head instead of waiting
        assert flat(await read_all(client, topic, 0, 2**63)) == records
        assert flat(await read_all(client, topic, 35, 1000)) == []
        # nothing was subscribed
        assert served.topic(topic).subscriptions == {}
        assert await served.broker.store.list(keys.subscriptions_prefix(topic)) == []


async def test_earliest_and_gaps_follow_the_durable_catalog(served: Served) -> None:
    topic = "/default/gaps"
    async with Client(served.url) as client:
        await tiered_topic(served, client, topic)
        store = served.broker.store
        name = TopicName.parse(topic)
        # A hole in the durable tier (offsets no object and no WAL file holds): those offsets are absent.
        await store.delete(keys.storage_object(name, 10))
        got = [o for o, _ in flat(await read_all(client, topic, 0, 35))]
        assert got == [*range(10), *range(20, 35)]
        # Below the earliest stored offset: absent too, and `earliest` says where data starts.
        await store.delete(keys.storage_object(name, 0))
        span = await client.offsets(topic)
        assert (span.earliest, span.next) == (20, 35)
        assert [o for o, _ in flat(await read_all(client, topic, 0, 35))] == list(range(20, 35))
        assert [o for o, _ in flat(await read_all(client, topic, 3, 22))] == [20, 21]


async def test_offsets_and_read_errors(served: Served) -> None:
    async with Client(served.url) as client:
        producer = await client.producer("/default/volatile", "p", reliable=False)
        await producer.send(b"x")
        with pytest.raises(errors.FailedPrecondition, match="not reliable"):
            await client.offsets("/default/volatile")
        with pytest.raises(errors.FailedPrecondition, match="not reliable"):
            await read_all(client, "/default/volatile", 0, 10)
        with pytest.raises(errors.NotFound):
            await client.offsets("/default/nothing-here")
        with pytest.raises(errors.NotFound):
            await read_all(client, "/default/nothing-here", 0, 10)
        with pytest.raises(errors.InvalidArgument):
            await client.offsets("not a topic")
        for start, end, kw in ((5, 4, {}), (0, 2**63 + 1, {}), (-1, 3, {}), (0, 3, {"max_records": 0})):
            with pytest.raises(errors.InvalidArgument):
                await read_all(client, "/default/volatile", start, end, **kw)
        await publish(client, "/default/reliable", 0, 3)
        # The broker checks the range itself too (a client of its own may send anything).
        stub = client.stub()
        for start, end in ((5, 4), (0, 2**63 + 1)):
            call = stub.Read(pb.ReadRequest(topic="/default/reliable", start=start, end=end))
            with pytest.raises(grpc.aio.AioRpcError) as info:
                async for _ in call:
                    pass
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # max_records 0 means the default; every record comes in one batch
        batches = [b async for b in stub.Read(pb.ReadRequest(topic="/default/reliable", start=0, end=3))]
        assert [b.count for b in batches] == [3]


async def test_server_read_ends_unavailable_when_the_topic_leaves(served: Served) -> None:
    topic = "/default/leaving"
    async with Client(served.url) as client:
        await publish(client, topic, 0, 10)
    broker = served.broker
    batches = broker.read_range(topic, 0, 10, 3, 1 << 20)
    first = await anext(batches)
    assert [o for o, _ in first] == [0, 1, 2]
    await broker.request_unload(TopicName.parse(topic))  # standalone: sealed, reloaded on next use
    with pytest.raises(errors.Unavailable, match="moved"):
        await anext(batches)
    await batches.aclose()


async def test_client_read_continues_across_an_unload(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The topic leaves the broker after the first batch of a read: the read ends UNAVAILABLE, the client
    looks the topic up again and resumes right after the last offset it yielded."""
    topic = "/default/unloaded"
    broker = served.broker
    calls: list[int] = []
    unloaded = asyncio.Event()
    original = broker.read_range

    async def gated(
        name: str, start: int, end: int, max_records: int, max_bytes: int
    ) -> AsyncIterator[list[tuple[int, bytes]]]:
        calls.append(start)
        batches = original(name, start, end, max_records, max_bytes)
        async for batch in batches:
            yield batch
            if len(calls) == 1:
                await unloaded.wait()  # hold the first read after its first batch until the unload is done
        await batches.aclose()

    monkeypatch.setattr(broker, "read_range", gated)
    async with Client(served.url, backoff_base=0.01) as client:
        producer = await client.producer(topic, "p")
        payloads = [b"u%03d" % i for i in range(100)]
        offsets = await producer.send_batch(payloads)
        await producer.close()
        got: list[tuple[int, bytes]] = []
        reader = client.read(topic, 0, len(payloads), max_records=10)
        got += await anext(reader)
        await broker.request_unload(TopicName.parse(topic))
        assert topic not in broker.topics
        unloaded.set()
        async with asyncio.timeout(30):
            async for batch in reader:
                got += batch
        assert calls == [0, 10]
        assert [o for o, _ in got] == offsets
        assert [decode_message(r).payload for _, r in got] == payloads


def traced_by_line(path: str) -> dict[int, int]:
    """Bytes still allocated (tracemalloc is tracing) per line of the file at `path`."""
    kept = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, path)])
    return {s.traceback[0].lineno: s.size for s in kept.statistics("lineno")}


def line_of(function: Callable[..., object], text: str) -> int:
    """The line number of the one line of `function` that contains `text`."""
    lines, first = inspect.getsourcelines(function)
    found = [first + i for i, line in enumerate(lines) if text in line]
    assert len(found) == 1, f"{text!r} in {function.__name__}: {found}"
    return found[0]


async def test_an_idle_publish_stream_keeps_none_of_its_decoded_records(served: Served) -> None:
    """Once a batch's append has started, only its records' bytes stay (the WAL's cache keeps them); the
    records as decoded for the checks (~0.4 KB each) go. A stream that then idles kept its last batch's
    decoded records until its next batch came: 1,000 producers that had each sent one batch of 1,024 held
    about 0.4 GB that way."""
    decoded_line = line_of(record._decode, "records = decoder.decode(data)")
    raw_line = line_of(record._decode, "raws = _raw_records.decode(data)")
    count = 2000
    tracemalloc.start(1)
    try:
        async with Client(served.url) as client:
            producer = await client.producer("/default/idle-stream", "p", reliable=True)
            offsets = await producer.send_batch([b"x" * 100] * count)
            assert offsets == list(range(count))
            gc.collect()
            by_line = traced_by_line(record.__file__)
            # The cache holds the records' raw views: tracemalloc does see what the server allocated.
            assert by_line.get(raw_line, 0) >= count * 40
            # Nothing decoded is left, while the producer's stream is still open.
            assert by_line.get(decoded_line, 0) < count * 10
            assert served.topic("/default/idle-stream").producers
            await producer.close()
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("delivery", ["reliable", "non_reliable"])
async def test_every_record_of_a_batch_is_checked_and_a_bad_one_refuses_the_batch(
    served: Served, delivery: str
) -> None:
    """The producer id and name, and the attributes, of every record (not only the first), on both
    topic kinds: a batch with one bad record after good ones is refused whole with INVALID_ARGUMENT and
    nothing of it is stored."""
    topic = f"/default/checked-{delivery.replace('_', '-')}"
    opening = pb.PublishOpen(
        topic=topic, producer_name="raw", delivery=pb.RELIABLE if delivery == "reliable" else pb.NON_RELIABLE
    )
    encode = msgspec.msgpack.Encoder().encode
    async with grpc.aio.insecure_channel(served.url.removeprefix("http://")) as channel:
        stub = pb_grpc.IsterStub(channel)

        async def publish(bad: Any) -> grpc.aio.AioRpcError | pb.PublishAck:
            call = stub.Publish()
            await call.write(pb.PublishRequest(open=opening))
            pid = (await call.read()).opened.producer_id
            good = [b"ok", 1, pid, "raw", {}, None, None, None]
            records = [good, good, bad(pid)] if bad is not None else [good, good]
            batch = pb.PublishBatch(sequence=1, records=encode(records), count=len(records))
            await call.write(pb.PublishRequest(batch=batch))
            try:
                return (await call.read()).ack
            except grpc.aio.AioRpcError as exc:
                return exc
            finally:
                call.cancel()

        refused = {
            "another producer id": lambda pid: [b"x", 1, pid + 1, "raw"],
            "another producer name": lambda pid: [b"x", 1, pid, "other"],
            "attributes of another type": lambda pid: [b"x", 1, pid, "raw", {"a": 1}],
            "too many attributes": lambda pid: [b"x", 1, pid, "raw", {f"k{i}": "v" for i in range(257)}],
        }
        for why, bad in refused.items():
            got = await publish(bad)
            assert isinstance(got, grpc.aio.AioRpcError), why
            assert got.code() == grpc.StatusCode.INVALID_ARGUMENT, (why, got.details())
            assert "batch 1" in (got.details() or ""), why
        ok = await publish(lambda pid: [b"h", 1, pid, "raw", {"h": "1"}])
        assert isinstance(ok, pb.PublishAck) and ok.count == 3
    if delivery != "reliable":
        return  # nothing is stored to look at
    assert ok.first_offset == 0
    async with Client(served.url) as client:
        stored = [decode_message(r).attributes for _, r in flat(await read_all(client, topic, 0, 10))]
    assert stored == [{}, {}, {"h": "1"}]  # the refused batches left nothing


async def test_a_consumer_that_caught_up_keeps_none_of_its_frames(served: Served) -> None:
    """A Consume stream that delivered a backlog and now waits for new messages holds none of the frames it
    sent: it kept its last one (up to ~1 MB) until the next came, about 1 GB for 1,000 idle consumers."""
    from ister.server import ister_api

    joined_line = line_of(ister_api._next_frame, 'return b"".join(parts), count')
    topic, count = "/default/idle-consumer", 500
    async with Client(served.url) as client:
        producer = await client.producer(topic, "p", reliable=True)
        consumer = await client.consumer(topic, "s", window=count)
        tracemalloc.start(1)  # before the frames are made: the broker sends them as soon as they are durable
        try:
            await producer.send_batch([b"y" * 1000] * count)
            got: list[bytes] = []
            while len(got) < count:
                batch = await consumer.receive_batch(max_messages=count)
                got += [m.payload for m in batch]
                for m in batch:
                    await consumer.ack(m)
            assert got == [b"y" * 1000] * count
            del batch, got
            gc.collect()
            by_line = traced_by_line(ister_api.__file__)
            assert by_line.get(joined_line, 0) < 1000, "an idle stream still holds a frame it sent"
            assert served.topic(topic).subscriptions  # the consumer is still there, waiting
        finally:
            tracemalloc.stop()
        await consumer.close()
        await producer.close()


async def test_a_danube_consumer_that_caught_up_keeps_none_of_its_messages(served: Served) -> None:
    """The Danube API's ReceiveMessages sends messages one by one from chunks: once a consumer has all of
    them and waits for more, the broker holds neither the last chunk nor its decoded messages."""
    # Imported here: the module is collected beside the official client, which registers the same protos.
    from ister.wire.gen import DanubeApi_pb2 as dpb
    from ister.wire.gen import DanubeApi_pb2_grpc as dpb_grpc

    decoded_line = line_of(record.decode_message, "return _decoder.decode(plain(data))")
    topic, count, size = "/default/idle-danube", 20, 10_000
    async with Client(served.url) as client:
        producer = await client.producer(topic, "p", reliable=True)
        async with grpc.aio.insecure_channel(served.url.removeprefix("http://")) as channel:
            stub = dpb_grpc.ConsumerServiceStub(channel)
            subscribed = await stub.Subscribe(
                dpb.ConsumerRequest(
                    request_id=1, topic_name=topic, consumer_name="d", subscription="s", subscription_type=0
                )
            )
            receive = dpb.ReceiveRequest(request_id=2, consumer_id=subscribed.consumer_id)
            stream = stub.ReceiveMessages(receive)
            tracemalloc.start(1)  # before anything is decoded for delivery
            try:
                await producer.send_batch([b"z" * size] * count)
                offsets = []
                while len(offsets) < count:
                    message = await stream.read()
                    assert message.payload == b"z" * size
                    offsets.append(message.msg_id.topic_offset)
                    ack = dpb.AckRequest(request_id=3, msg_id=message.msg_id, subscription_name="s")
                    await stub.Ack(ack)
                assert offsets == list(range(count))
                del message
                gc.collect()
                by_line = traced_by_line(record.__file__)
                assert by_line.get(decoded_line, 0) < size, "an idle stream still holds a decoded message"
            finally:
                tracemalloc.stop()
                stream.cancel()
        await producer.close()


async def test_producers_whose_clients_are_gone_are_forgotten_and_stop_counting(served: Served) -> None:
    """A producer with an open Publish stream stays however long it is quiet; once its stream closed and it
    was not seen for the idle time, it is forgotten: its metadata record goes, and it no longer counts
    against `max_producers_per_topic` (which refused every new producer for good once reached)."""
    topic, store = "/default/reaped", served.broker.store
    kv = await store.get(keys.namespace_policy("default"))
    assert kv is not None
    await store.put(keys.namespace_policy("default"), {**kv.value, "max_producers_per_topic": 1})
    async with Client(served.url) as client:
        first = await client.producer(topic, "first", reliable=True)
        assert await first.send_batch([b"1"]) == [0]
        assert await served.broker.reap_producers(time.monotonic() + 1) == 0  # its stream is open
        with pytest.raises(errors.FailedPrecondition, match="max_producers_per_topic"):
            await (await client.producer(topic, "second", reliable=True)).send_batch([b"2"])
        await first.close()
        loaded = served.topic(topic)
        await until(lambda: all(not p.attached for p in loaded.producers.values()), "the stream closed")
        assert await served.broker.reap_producers(time.monotonic() - 60) == 0  # seen a moment ago
        assert await served.broker.reap_producers(time.monotonic() + 1) == 1
        assert loaded.producers == {}
        assert await store.list(keys.topic_producers_prefix(topic)) == []
        second = await client.producer(topic, "second", reliable=True)
        assert await second.send_batch([b"2"]) == [1]
        await second.close()


async def idle_producer(served: Served, topic: str) -> Topic:
    """`topic` (loaded) with one producer that sent a message and closed its stream."""
    async with Client(served.url) as client:
        producer = await client.producer(topic, "p", reliable=True)
        await producer.send_batch([b"x"])
        await producer.close()
    loaded = served.topic(topic)
    await until(lambda: all(not p.attached for p in loaded.producers.values()), "the stream closed")
    return loaded


async def store_down(*args: Any) -> None:
    raise MetadataError("the metadata store is down")


async def test_a_store_that_cannot_be_written_keeps_an_idle_producer_until_it_can(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded = await idle_producer(served, "/default/reap-later")
    store = served.broker.store
    monkeypatch.setattr(store, "delete", store_down)
    assert await served.broker.reap_producers(time.monotonic() + 1) == 0
    assert len(loaded.producers) == 1
    monkeypatch.undo()
    assert await served.broker.reap_producers(time.monotonic() + 1) == 1
    assert loaded.producers == {}


async def test_a_producer_used_while_its_record_is_deleted_keeps_it(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A send that arrives while the reaper deletes an idle producer's record: the producer stays and its
    record is written back; when that write fails, it stays in memory and a later pass deals with it."""
    topic = "/default/reap-race"
    loaded = await idle_producer(served, topic)
    (session,) = loaded.producers.values()
    store = served.broker.store
    key = keys.topic_producer(topic, session.id)
    real_delete, real_put = store.delete, store.put

    async def delete_while_used(k: str) -> None:
        await real_delete(k)
        session.touch()  # a send or health check of this producer, while the delete was awaited

    monkeypatch.setattr(store, "delete", delete_while_used)
    assert await served.broker.reap_producers(time.monotonic()) == 0
    assert loaded.producers == {session.id: session}
    assert await store.get(key) is not None  # written back

    monkeypatch.setattr(store, "put", store_down)
    assert await served.broker.reap_producers(time.monotonic()) == 0
    assert loaded.producers == {session.id: session}  # kept: its record is missing until a later pass
    monkeypatch.setattr(store, "delete", real_delete)
    monkeypatch.setattr(store, "put", real_put)
    assert await served.broker.reap_producers(time.monotonic() + 1) == 1
    assert loaded.producers == {} and await store.get(key) is None


async def test_a_danube_producer_forgotten_while_quiet_is_told_unavailable_then_created_again(
    served: Served,
) -> None:
    """A Danube producer is kept alive by its health checks and sends; forgotten while quiet, its next send
    gets UNAVAILABLE (the official client then creates it again) and its health check CLOSE."""
    from ister.wire.gen import DanubeApi_pb2 as dpb
    from ister.wire.gen import DanubeApi_pb2_grpc as dpb_grpc

    topic = "/default/danube-reaped"
    async with grpc.aio.insecure_channel(served.url.removeprefix("http://")) as channel:
        producers = dpb_grpc.ProducerServiceStub(channel)
        health = dpb_grpc.HealthCheckStub(channel)
        create = dpb.ProducerRequest(request_id=1, producer_name="d", topic_name=topic, dispatch_strategy=1)
        pid = (await producers.CreateProducer(create)).producer_id

        def message(producer_id: int) -> Any:
            msg_id = dpb.MsgID(producer_id=producer_id, topic_name=topic)
            return dpb.StreamMessage(request_id=2, msg_id=msg_id, payload=b"m", producer_name="d")

        async def checked(producer_id: int) -> int:
            req = dpb.HealthCheckRequest(request_id=3, client=dpb.HealthCheckRequest.Producer, id=producer_id)
            return int((await health.HealthCheck(req)).status)

        session = served.broker.producers[pid]
        session.last_seen -= 3600  # quiet for an hour, then it sends: kept
        await producers.SendMessage(message(pid))
        assert await served.broker.reap_producers(time.monotonic() - 60) == 0
        session.last_seen -= 3600  # quiet for an hour, then it health-checks: kept
        assert await checked(pid) == dpb.HealthCheckResponse.OK
        assert await served.broker.reap_producers(time.monotonic() - 60) == 0
        assert await served.broker.reap_producers(time.monotonic() + 1) == 1
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await producers.SendMessage(message(pid))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value.details()
        assert await checked(pid) == dpb.HealthCheckResponse.CLOSE
        again = (await producers.CreateProducer(create)).producer_id
        assert again != pid
        await producers.SendMessage(message(again))
    async with Client(served.url) as client:
        assert (await client.offsets(topic)).next == 2
