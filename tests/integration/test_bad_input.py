"""Bad input gets a clear gRPC error, changes nothing, and the broker keeps serving."""

from __future__ import annotations

import danube
import grpc
import pytest
from danube.proto import DanubeApi_pb2 as pb
from danube.proto import DanubeApi_pb2_grpc as pb_grpc

from tests.integration.harness import BrokerProcess, client, consumer, nothing_within, producer, take

pytestmark = pytest.mark.integration


def _channel(broker: BrokerProcess) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(
        f"127.0.0.1:{broker.port}", options=[("grpc.max_send_message_length", -1)]
    )


async def _code(call: object) -> grpc.StatusCode:
    try:
        await call  # type: ignore[misc]
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


@pytest.mark.parametrize(
    "name", ["no-slash", "/default", "/default/a/b", "/default/has space", "/default/dot.ted", "//x"]
)
async def test_invalid_topic_names(shared_broker: BrokerProcess, name: str) -> None:
    async with _channel(shared_broker) as ch:
        stub = pb_grpc.ProducerServiceStub(ch)
        code = await _code(
            stub.CreateProducer(pb.ProducerRequest(request_id=1, producer_name="p", topic_name=name))
        )
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        lookup = pb_grpc.DiscoveryStub(ch)
        code = await _code(lookup.TopicLookup(pb.TopicLookupRequest(request_id=1, topic=name)))
        assert code == grpc.StatusCode.INVALID_ARGUMENT


async def test_unknown_namespace_and_ids(shared_broker: BrokerProcess) -> None:
    async with _channel(shared_broker) as ch:
        prod = pb_grpc.ProducerServiceStub(ch)
        code = await _code(
            prod.CreateProducer(pb.ProducerRequest(request_id=1, producer_name="p", topic_name="/nope/t"))
        )
        assert code == grpc.StatusCode.NOT_FOUND
        msg = pb.StreamMessage(
            request_id=1, msg_id=pb.MsgID(producer_id=42, topic_name="/default/x"), payload=b"x"
        )
        assert await _code(prod.SendMessage(msg)) == grpc.StatusCode.NOT_FOUND
        cons = pb_grpc.ConsumerServiceStub(ch)
        stream = cons.ReceiveMessages(pb.ReceiveRequest(request_id=1, consumer_id=42))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in stream:
                pass
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        sub = pb.ConsumerRequest(
            request_id=1, topic_name="/default/never_created", consumer_name="c", subscription="s"
        )
        assert await _code(cons.Subscribe(sub)) == grpc.StatusCode.NOT_FOUND
        health = pb_grpc.HealthCheckStub(ch)
        resp = await health.HealthCheck(pb.HealthCheckRequest(request_id=1, client=1, id=42))
        assert resp.status == pb.HealthCheckResponse.CLOSE
        lookup = pb_grpc.DiscoveryStub(ch)
        assert await _code(lookup.TopicLookup(pb.TopicLookupRequest(topic="/default/never_created"))) == (
            grpc.StatusCode.NOT_FOUND
        )


async def test_oversize_message_rejected_and_nothing_stored(shared_broker: BrokerProcess, topic: str) -> None:
    c = await client(shared_broker.url)
    p = await producer(c, topic, "p1", reliable=True)
    cons, q = await consumer(c, topic, "c", "s", danube.SubType.EXCLUSIVE)
    async with _channel(shared_broker) as ch:
        prod = pb_grpc.ProducerServiceStub(ch)
        resp = await prod.CreateProducer(
            pb.ProducerRequest(
                request_id=1, producer_name="raw", topic_name=topic, dispatch_strategy=pb.Reliable
            )
        )
        big = pb.StreamMessage(
            request_id=2,
            msg_id=pb.MsgID(producer_id=resp.producer_id, topic_name=topic),
            payload=b"x" * (10 * 1024 * 1024 + 1),
        )
        try:
            await prod.SendMessage(big)
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "max_message_size" in (exc.details() or "")
        else:
            raise AssertionError("oversize message accepted")
    await p.send(b"small")
    got = (await take(q, 1))[0]
    assert got.payload == b"small"
    assert got.msg_id.topic_offset == 0  # the rejected message took no offset
    await cons.ack(got)


async def test_strategy_mismatch_rejected(shared_broker: BrokerProcess, topic: str) -> None:
    c = await client(shared_broker.url)
    await producer(c, topic, "p1", reliable=True)
    async with _channel(shared_broker) as ch:
        prod = pb_grpc.ProducerServiceStub(ch)
        req = pb.ProducerRequest(
            request_id=1, producer_name="p2", topic_name=topic, dispatch_strategy=pb.NonReliable
        )
        try:
            await prod.CreateProducer(req)
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "Reliable" in (exc.details() or "")
        else:
            raise AssertionError("mismatched dispatch strategy accepted")


async def test_ack_of_undelivered_offset_ignored(shared_broker: BrokerProcess, topic: str) -> None:
    c = await client(shared_broker.url)
    p = await producer(c, topic, "p1", reliable=True)
    cons, q = await consumer(c, topic, "c", "ackbad", danube.SubType.EXCLUSIVE)
    await p.send(b"first")
    first = (await take(q, 1))[0]
    async with _channel(shared_broker) as ch:
        stub = pb_grpc.ConsumerServiceStub(ch)
        bogus = pb.AckRequest(
            request_id=1, msg_id=pb.MsgID(topic_name=topic, topic_offset=999), subscription_name="ackbad"
        )
        assert await _code(stub.Ack(bogus)) == grpc.StatusCode.OK
        unknown_sub = pb.AckRequest(
            request_id=1, msg_id=pb.MsgID(topic_name=topic, topic_offset=0), subscription_name="nope"
        )
        assert await _code(stub.Ack(unknown_sub)) == grpc.StatusCode.NOT_FOUND
    # The message that was really delivered is still unacked: it comes back after a reconnect.
    await cons.close()
    cons2, q2 = await consumer(c, topic, "c", "ackbad", danube.SubType.EXCLUSIVE)
    again = (await take(q2, 1))[0]
    assert again.payload == first.payload
    await cons2.ack(again)
    assert await nothing_within(q2, 0.5)
