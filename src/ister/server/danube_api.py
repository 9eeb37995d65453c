"""Servicers of the Danube client contract (package `danube`): producer, consumer, discovery, health."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from ister.broker.service import BrokerService
from ister.broker.sessions import OutChunk
from ister.broker.subscription import Subscription
from ister.errors import InvalidArgument
from ister.ids import TopicName, clip
from ister.limits import MAX_NACK_REASON_BYTES
from ister.server.errors import server_stream, unary
from ister.server.handlers import add_service
from ister.server.peers import peer_address
from ister.wire.convert import stored_from_wire, wire_from_stored
from ister.wire.enums import access_mode_from_wire, reliable_from_wire, sub_type_from_wire
from ister.wire.gen import DanubeApi_pb2 as pb
from ister.wire.gen import DanubeApi_pb2_grpc as pb_grpc

Ctx = Any  # grpc.aio.ServicerContext (untyped library)

log = logging.getLogger(__name__)


class ProducerServicer(pb_grpc.ProducerServiceServicer):  # type: ignore[misc]
    def __init__(self, broker: BrokerService) -> None:
        self.broker = broker
        self.validator = broker.validator

    @unary
    async def CreateProducer(self, request: pb.ProducerRequest, context: Ctx) -> pb.ProducerResponse:
        subject = request.schema_ref.subject if request.HasField("schema_ref") else ""
        if subject:
            await self.broker.schemas.check_producer(request.topic_name, subject)
        producer_id = await self.broker.create_producer(
            request.topic_name,
            request.producer_name,
            reliable=reliable_from_wire(request.dispatch_strategy, "dispatch_strategy"),
            access_mode=access_mode_from_wire(request.producer_access_mode),
        )
        if subject:
            await self.broker.schemas.attach_producer(request.topic_name, subject)
        session = self.broker.producers.get(producer_id)
        if session is not None:
            session.connected(peer_address(context))
        return pb.ProducerResponse(
            request_id=request.request_id, producer_id=producer_id, producer_name=request.producer_name
        )

    @unary
    async def SendMessage(self, request: pb.StreamMessage, context: Ctx) -> pb.MessageResponse:
        if not request.HasField("msg_id"):
            raise InvalidArgument("msg_id is required")
        session = await self.broker.producer(request.msg_id.producer_id, request.msg_id.topic_name)
        message = stored_from_wire(request, session.id, session.name)
        await self.validator.check(session.topic, (message,))
        session.sent(1, len(message.payload))
        await self.broker.send(session, message)
        return pb.MessageResponse(request_id=request.request_id)


class ConsumerServicer(pb_grpc.ConsumerServiceServicer):  # type: ignore[misc]
    def __init__(self, broker: BrokerService) -> None:
        self.broker = broker

    @unary
    async def Subscribe(self, request: pb.ConsumerRequest, context: Ctx) -> pb.ConsumerResponse:
        consumer_id = await self.broker.subscribe(
            request.topic_name,
            request.subscription,
            request.consumer_name,
            sub_type_from_wire(request.subscription_type),
            list(request.key_filters),
        )
        return pb.ConsumerResponse(
            request_id=request.request_id, consumer_id=consumer_id, consumer_name=request.consumer_name
        )

    @server_stream
    async def ReceiveMessages(
        self, request: pb.ReceiveRequest, context: Ctx
    ) -> AsyncIterator[pb.StreamMessage]:
        ref, stream = await self.broker.open_stream(request.consumer_id)
        ref.session.address = peer_address(context)
        topic, sub, addr = ref.session.topic, ref.subscription.name, self.broker.broker_url
        try:
            while True:
                got = await stream.get()
                if got is None:
                    return
                items = iter(got.outbounds() if isinstance(got, OutChunk) else (got,))
                del got
                # Nothing of a delivered chunk stays referenced while the consumer waits for the next one.
                while (item := next(items, None)) is not None:
                    try:
                        out = wire_from_stored(
                            item.message, offset=item.offset, topic=topic, subscription=sub, broker_addr=addr
                        )
                    except Exception as exc:  # a stored record outside the wire's ranges (or undecodable)
                        await _undeliverable(ref.subscription, item.offset, exc)
                        continue
                    del item
                    yield out
                    del out
                del items
        finally:
            self.broker.close_stream(ref, stream)

    @unary
    async def Ack(self, request: pb.AckRequest, context: Ctx) -> pb.AckResponse:
        if not request.HasField("msg_id"):
            raise InvalidArgument("msg_id is required")
        await self.broker.ack(
            request.msg_id.topic_name, request.subscription_name, request.msg_id.topic_offset
        )
        return pb.AckResponse(request_id=request.request_id)

    @unary
    async def Nack(self, request: pb.NackRequest, context: Ctx) -> pb.NackResponse:
        if not request.HasField("msg_id"):
            raise InvalidArgument("msg_id is required")
        if request.HasField("reason") and len(request.reason.encode()) > MAX_NACK_REASON_BYTES:
            raise InvalidArgument(f"nack reason is longer than {MAX_NACK_REASON_BYTES} bytes")
        await self.broker.nack(
            request.msg_id.topic_name,
            request.subscription_name,
            request.msg_id.topic_offset,
            request.delay_ms if request.HasField("delay_ms") else None,
            request.reason if request.HasField("reason") else None,
        )
        return pb.NackResponse(request_id=request.request_id)


async def _undeliverable(sub: Subscription, offset: int, exc: Exception) -> None:
    """A stored record that cannot become a StreamMessage (stored before publishes were checked): it goes
    through the subscription's poison policy at once, instead of failing the stream and coming straight
    back. Logged once per record and subscription, not per attempt."""
    reason = clip(f"the stored record cannot be sent to a Danube consumer: {type(exc).__name__}: {exc}")
    if await sub.poison(offset, reason):
        log.warning("%s/%s: offset %d: %s; the poison policy applies", sub.topic, sub.name, offset, reason)


class DiscoveryServicer(pb_grpc.DiscoveryServicer):  # type: ignore[misc]
    def __init__(self, broker: BrokerService) -> None:
        self.broker = broker

    @unary
    async def TopicLookup(self, request: pb.TopicLookupRequest, context: Ctx) -> pb.TopicLookupResponse:
        url, local = await self.broker.lookup(TopicName.parse(request.topic))
        kind = pb.TopicLookupResponse.Connect if local else pb.TopicLookupResponse.Redirect
        return pb.TopicLookupResponse(
            request_id=request.request_id,
            response_type=kind,
            connect_url=url,
            broker_url=url,
            proxy=False,
        )

    @unary
    async def TopicPartitions(
        self, request: pb.TopicLookupRequest, context: Ctx
    ) -> pb.TopicPartitionsResponse:
        names = await self.broker.partitions(TopicName.parse(request.topic))
        return pb.TopicPartitionsResponse(request_id=request.request_id, partitions=names)


class HealthServicer(pb_grpc.HealthCheckServicer):  # type: ignore[misc]
    def __init__(self, broker: BrokerService) -> None:
        self.broker = broker

    @unary
    async def HealthCheck(self, request: pb.HealthCheckRequest, context: Ctx) -> pb.HealthCheckResponse:
        if request.client == pb.HealthCheckRequest.Producer:
            alive = self.broker.producer_alive(request.id)
        elif request.client == pb.HealthCheckRequest.Consumer:
            alive = self.broker.consumer_alive(request.id)
        else:
            raise InvalidArgument(f"unknown client type {request.client}")
        status = pb.HealthCheckResponse.OK if alive else pb.HealthCheckResponse.CLOSE
        return pb.HealthCheckResponse(status=status)


def add_danube_services(server: Any, broker: BrokerService) -> None:
    add_service(server, ProducerServicer(broker), pb, "ProducerService")
    add_service(server, ConsumerServicer(broker), pb, "ConsumerService")
    add_service(server, DiscoveryServicer(broker), pb, "Discovery")
    add_service(server, HealthServicer(broker), pb, "HealthCheck")
