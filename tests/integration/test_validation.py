"""Issue 14: one validation for both client APIs, unknown enum values refused, bad bodies and bad frames are
INVALID_ARGUMENT with a short message and no traceback, echoed input is cut, and a stored record that cannot
become a Danube message is dead-lettered instead of wedging its subscription."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import grpc
import msgspec
import pytest
from danube.proto import DanubeApi_pb2 as dpb

from ister.core.record import StoredMessage, encode_message
from ister.storage.wal import Wal
from ister.wire.gen import DanubeAdmin_pb2 as apb
from ister.wire.gen import ister_v1_pb2 as ipb
from tests.integration.harness import BrokerProcess, client, consumer, producer, take

pytestmark = pytest.mark.integration

U32_MAX, U64_MAX = 2**32 - 1, 2**64 - 1


def _unary(ch: grpc.aio.Channel, path: str) -> Any:
    return ch.unary_unary(path, request_serializer=None, response_deserializer=None)


async def _status(coro: Any) -> tuple[grpc.StatusCode, str]:
    try:
        await coro
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


async def _publish(
    broker: BrokerProcess, topic: str, records: list[Any] | bytes, count: int | None = None
) -> Any:
    """One batch on the batch API (producer 'raw', reliable): the PublishAck, or the AioRpcError."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.port}") as ch:
        call = ch.stream_stream(
            "/ister.v1.Ister/Publish", request_serializer=None, response_deserializer=None
        )()
        opened = ipb.PublishOpen(topic=topic, producer_name="raw", delivery=ipb.RELIABLE)
        await call.write(ipb.PublishRequest(open=opened).SerializeToString())
        pid = ipb.PublishResponse.FromString(await call.read()).opened.producer_id
        if isinstance(records, list):
            records = msgspec.msgpack.encode([[r[0], r[1], pid, "raw", *r[2:]] for r in records])
            count = len(msgspec.msgpack.decode(records)) if count is None else count
        batch = ipb.PublishBatch(sequence=1, records=records, count=count or 0)
        await call.write(ipb.PublishRequest(batch=batch).SerializeToString())
        try:
            reply = await call.read()
        except grpc.aio.AioRpcError as exc:
            return exc
        await call.done_writing()
        return ipb.PublishResponse.FromString(reply).ack


async def _next_offset(broker: BrokerProcess, topic: str) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.port}") as ch:
        raw = await _unary(ch, "/ister.v1.Ister/Offsets")(ipb.OffsetsRequest(topic=topic).SerializeToString())
        return int(ipb.OffsetsResponse.FromString(raw).next)


def _assert_clean_log(broker: BrokerProcess) -> None:
    log = broker.log_path.read_text(errors="replace")
    assert "Traceback" not in log and "internal error" not in log, broker.log()


# -- item 1 and 6: every field of a batch record is checked, by the Danube path's rules ----------------------
async def test_batch_record_outside_the_wire_ranges_is_refused_and_nothing_stored(
    fresh_broker: BrokerProcess, topic: str
) -> None:
    c = await client(fresh_broker.url)
    await producer(c, topic, "p", reliable=True)
    cons, q = await consumer(c, topic, "c", "s")
    # [payload, publish_time, attributes, routing_key, schema_id, schema_version] (producer added by _publish)
    bad_fields: list[tuple[int, Any]] = [
        (1, -1),  # publish_time
        (4, -1),  # schema_id
        (5, U32_MAX + 1),  # schema_version
        (3, "k" * 1021),  # routing_key: the Danube path's limit is 1,020 characters
        (2, {"k": 1}),  # attributes
    ]
    for index, value in bad_fields:
        rec: list[Any] = [b"bad", 1, {}, None, None, None]
        rec[index] = value
        got = await _publish(fresh_broker, topic, [[b"ok-before", 1, {}, None, None, None], rec])
        assert isinstance(got, grpc.aio.AioRpcError), (index, value)
        assert got.code() == grpc.StatusCode.INVALID_ARGUMENT and "batch 1" in (got.details() or "")
    extra = await _publish(fresh_broker, topic, [[b"bad", 1, {}, None, None, None, "extra"]])
    assert isinstance(extra, grpc.aio.AioRpcError) and extra.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert await _next_offset(fresh_broker, topic) == 0  # no record of a refused batch was stored
    # The edges of every range are accepted and reach a Danube consumer intact.
    edge = [b"edge", U64_MAX, {"a": "b"}, "k" * 1020, U64_MAX, U32_MAX]
    ack = await _publish(fresh_broker, topic, [edge])
    assert isinstance(ack, ipb.PublishAck) and (ack.first_offset, ack.count) == (0, 1)
    (m,) = await take(q, 1, ack=cons)
    assert (m.payload, m.publish_time, m.attributes) == (b"edge", U64_MAX, {"a": "b"})
    assert m.msg_id.topic_offset == 0
    _assert_clean_log(fresh_broker)


async def test_routing_key_limit_is_the_same_on_both_apis(shared_broker: BrokerProcess, topic: str) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{shared_broker.port}") as ch:
        create = _unary(ch, "/danube.ProducerService/CreateProducer")
        req = dpb.ProducerRequest(request_id=1, producer_name="d", topic_name=topic, dispatch_strategy=1)
        pid = dpb.ProducerResponse.FromString(await create(req.SerializeToString())).producer_id
        send = _unary(ch, "/danube.ProducerService/SendMessage")
        for key, expected in (
            ("k" * 1020, grpc.StatusCode.OK),
            ("k" * 1021, grpc.StatusCode.INVALID_ARGUMENT),
        ):
            msg = dpb.StreamMessage(
                request_id=2,
                msg_id=dpb.MsgID(producer_id=pid, topic_name=topic),
                payload=b"x",
                routing_key=key,
            )
            code, _ = await _status(send(msg.SerializeToString()))
            assert code == expected
            batch = await _publish(shared_broker, topic, [[b"x", 1, {}, key, None, None]])
            assert (isinstance(batch, ipb.PublishAck)) == (expected == grpc.StatusCode.OK)
    assert await _next_offset(shared_broker, topic) == 2


# -- item 6: unknown enum values are refused, not read as NonReliable/Shared----------------------------------
async def test_unknown_enum_values_are_refused(shared_broker: BrokerProcess, topic: str) -> None:
    async with (
        grpc.aio.insecure_channel(f"127.0.0.1:{shared_broker.port}") as ch,
        grpc.aio.insecure_channel(shared_broker.admin_addr) as admin,
    ):
        create = _unary(ch, "/danube.ProducerService/CreateProducer")
        for fields in ({"dispatch_strategy": 2}, {"producer_access_mode": 5}, {"dispatch_strategy": -1}):
            req = dpb.ProducerRequest(request_id=1, producer_name="p", topic_name=topic, **fields)
            code, details = await _status(create(req.SerializeToString()))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "unknown" in details, fields
        call = ch.stream_stream(
            "/ister.v1.Ister/Publish", request_serializer=None, response_deserializer=None
        )()
        opened = ipb.PublishOpen(topic=topic, producer_name="p", delivery=3)  # type: ignore[arg-type]
        await call.write(ipb.PublishRequest(open=opened).SerializeToString())
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call.read()
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "unknown delivery 3" in (info.value.details() or "")
        for path, msg in (
            ("/danube_admin.TopicAdmin/CreateTopic", apb.NewTopicRequest(name=topic, dispatch_strategy=7)),
            (
                "/danube_admin.TopicAdmin/CreatePartitionedTopic",
                apb.PartitionedTopicRequest(base_name=topic, partitions=2, dispatch_strategy=7),
            ),
        ):
            code, details = await _status(_unary(admin, path)(msg.SerializeToString()))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "unknown dispatch_strategy 7" in details
        lookup = dpb.TopicLookupRequest(request_id=1, topic=topic)
        code, _ = await _status(_unary(ch, "/danube.Discovery/TopicLookup")(lookup.SerializeToString()))
        assert code == grpc.StatusCode.NOT_FOUND  # nothing was created


# -- item 4: echoed input is cut------------------------------------------------------------------------------
async def test_a_10kb_name_gets_a_short_invalid_argument(shared_broker: BrokerProcess) -> None:
    long_topic = "/default/" + "x" * 10_000
    async with (
        grpc.aio.insecure_channel(f"127.0.0.1:{shared_broker.port}") as ch,
        grpc.aio.insecure_channel(shared_broker.admin_addr) as admin,
    ):
        calls = [
            (ch, "/danube.Discovery/TopicLookup", dpb.TopicLookupRequest(topic=long_topic)),
            (ch, "/danube.ProducerService/CreateProducer", dpb.ProducerRequest(topic_name=long_topic)),
            (
                ch,
                "/danube.ConsumerService/Subscribe",
                dpb.ConsumerRequest(
                    topic_name="/default/t", subscription="s", consumer_name="c/" + "y" * 10_000
                ),
            ),
            (ch, "/ister.v1.Ister/Lookup", ipb.LookupRequest(topic=long_topic)),
            (admin, "/danube_admin.TopicAdmin/CreateTopic", apb.NewTopicRequest(name=long_topic)),
            (admin, "/danube_admin.NamespaceAdmin/CreateNamespace", apb.NamespaceRequest(name="n" * 10_000)),
            (
                admin,
                "/danube_admin.BrokerAdmin/UnloadBroker",
                apb.UnloadBrokerRequest(broker_id="9" * 10_000),
            ),
        ]
        for channel, path, msg in calls:
            code, details = await _status(_unary(channel, path)(msg.SerializeToString()))
            assert code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION), path
            assert len(details) < 400, (path, len(details))
    # The official client gets the error at once instead of retrying RESOURCE_EXHAUSTED for ever.
    c = await client(shared_broker.url)
    started = time.monotonic()
    with pytest.raises(Exception, match="invalid topic"):
        await asyncio.wait_for(producer(c, long_topic, "p"), 20)
    assert time.monotonic() - started < 10


# -- item 5: malformed bodies and frames----------------------------------------------------------------------
async def test_garbage_bodies_are_invalid_argument_without_traceback(fresh_broker: BrokerProcess) -> None:
    garbage = b"\xff\xff\xff\xff\x0f"
    async with (
        grpc.aio.insecure_channel(f"127.0.0.1:{fresh_broker.port}") as ch,
        grpc.aio.insecure_channel(fresh_broker.admin_addr) as admin,
    ):
        for channel, path in (
            (ch, "/danube.ProducerService/CreateProducer"),
            (ch, "/danube.ProducerService/SendMessage"),
            (ch, "/danube.ConsumerService/Ack"),
            (ch, "/ister.v1.Ister/Offsets"),
            (admin, "/danube_admin.TopicAdmin/CreateTopic"),
        ):
            code, details = await _status(_unary(channel, path)(garbage))
            assert code == grpc.StatusCode.INVALID_ARGUMENT, path
            assert "malformed request" in details
        for path in ("/danube.ConsumerService/ReceiveMessages", "/ister.v1.Ister/Read"):
            call = ch.unary_stream(path, request_serializer=None, response_deserializer=None)(garbage)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call.read()
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, path
        for path in ("/ister.v1.Ister/Publish", "/ister.v1.Ister/Consume"):
            call = ch.stream_stream(path, request_serializer=None, response_deserializer=None)()
            await call.write(garbage)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call.read()
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, path
            assert "malformed request" in (info.value.details() or "")
    # msgpack nested 100,000 deep, in a batch record's attributes (raw on a reliable topic) and as a record
    deep = b"\x91" * 100_000 + b"\xc0"
    for records in (
        b"\x91\x98\xc4\x01x\x00\x00\xa3raw" + deep + b"\xc0\xc0\xc0",
        b"\x91" + deep,
    ):
        got = await _publish(fresh_broker, "/default/deep", records, count=1)
        assert isinstance(got, grpc.aio.AioRpcError)
        assert got.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert len(got.details() or "") < 300
    _assert_clean_log(fresh_broker)


async def test_an_invalid_ack_frame_ends_consume_with_invalid_argument(
    shared_broker: BrokerProcess, topic: str
) -> None:
    c = await client(shared_broker.url)
    await producer(c, topic, "p", reliable=True)
    bad_frames = [
        ipb.ConsumeRequest(ack=ipb.Ack(ranges=[ipb.OffsetRange(first=5, last=2)])),
        ipb.ConsumeRequest(nack=ipb.Nack(reason="r" * 2000)),
        ipb.ConsumeRequest(),  # neither Ack nor Nack
    ]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{shared_broker.port}") as ch:
        for i, frame in enumerate(bad_frames):
            call = ch.stream_stream(
                "/ister.v1.Ister/Consume", request_serializer=None, response_deserializer=None
            )()
            opened = ipb.ConsumeOpen(topic=topic, subscription=f"s{i}", consumer_name="c")
            await call.write(ipb.ConsumeRequest(open=opened).SerializeToString())
            assert ipb.ConsumeResponse.FromString(await call.read()).HasField("opened")
            await call.write(frame.SerializeToString())
            with pytest.raises(grpc.aio.AioRpcError) as info:
                while True:
                    await call.read()
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, frame


# -- item 1, second line: a stored record that cannot become a StreamMessage----------------------------------
async def test_a_stored_record_outside_the_wire_ranges_is_dead_lettered_not_wedging(
    fresh_broker: BrokerProcess, topic: str
) -> None:
    """A record stored before publishes were checked (written here straight into the topic's WAL while the
    broker is down): the Danube consumer gets the messages behind it, the record goes to the dead-letter
    topic (its fields repaired so that it can be delivered there), and the broker logs it once."""
    c = await client(fresh_broker.url)
    p = await producer(c, topic, "p", reliable=True)
    cons, q = await consumer(c, topic, "c", "s")
    await p.send(b"before")
    (first,) = await take(q, 1, ack=cons)
    pid = first.msg_id.producer_id
    await cons.close()
    assert fresh_broker.terminate() == 0

    name = topic.split("/")[2]
    wal = await Wal.open(fresh_broker.data_dir / "wal" / "default" / name)
    try:
        bad = StoredMessage(b"bad", -5, pid, "p", {"a": "b"}, None, -1, U32_MAX + 1)
        good = [StoredMessage(b"after-%d" % i, 1, pid, "p") for i in range(3)]
        assert await wal.append([encode_message(m) for m in [good[0], bad, *good[1:]]]) == 1
    finally:
        await wal.close()

    fresh_broker.start()
    c = await client(fresh_broker.url)
    cons, q = await consumer(c, topic, "c", "s")
    got = await take(q, 3, ack=cons)
    assert [m.payload for m in got] == [b"after-0", b"after-1", b"after-2"]
    assert [m.msg_id.topic_offset for m in got] == [1, 3, 4]

    dlq = f"{topic}-DLQ"
    deadline = time.monotonic() + 15
    while True:  # the dead letter is published by the subscription's own task
        with contextlib.suppress(grpc.aio.AioRpcError):
            if await _next_offset(fresh_broker, dlq) == 1:
                break
        assert time.monotonic() < deadline, "no dead letter"
        await asyncio.sleep(0.05)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{fresh_broker.port}") as ch:
        req = ipb.SetCursorRequest(topic=dlq, subscription="d", next=0)
        await _unary(ch, "/ister.v1.Ister/SetCursor")(req.SerializeToString())
    dcons, dq = await consumer(c, dlq, "d", "d")
    (dead,) = await take(dq, 1, ack=dcons)
    assert dead.payload == b"bad" and dead.publish_time == 0
    assert dead.attributes["a"] == "b"
    assert dead.attributes["x-original-topic-offset"] == "2"
    assert "cannot be sent to a Danube consumer" in dead.attributes["x-failure-reason"]

    log = fresh_broker.log_path.read_text(errors="replace")
    assert log.count("the poison policy applies") == 1, fresh_broker.log()
    _assert_clean_log(fresh_broker)
    await dcons.close()
    await cons.close()
