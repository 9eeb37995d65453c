"""Conversions between the Danube wire messages and Ister's core records."""

from __future__ import annotations

from ister.core.record import StoredMessage
from ister.errors import InvalidArgument
from ister.limits import MAX_ATTRIBUTE_BYTES, MAX_ATTRIBUTES, MAX_NAME_LEN
from ister.wire.gen import DanubeApi_pb2 as pb


def stored_from_wire(msg: pb.StreamMessage, producer_id: int, producer_name: str) -> StoredMessage:
    """Validate the client-supplied parts of a StreamMessage and build the record to persist."""
    attrs = dict(msg.attributes)
    if len(attrs) > MAX_ATTRIBUTES:
        raise InvalidArgument(f"too many attributes: {len(attrs)} > {MAX_ATTRIBUTES}")
    if sum(len(k.encode()) + len(v.encode()) for k, v in attrs.items()) > MAX_ATTRIBUTE_BYTES:
        raise InvalidArgument(f"attributes exceed {MAX_ATTRIBUTE_BYTES} bytes")
    routing_key = msg.routing_key if msg.HasField("routing_key") else None
    if routing_key is not None and len(routing_key) > MAX_NAME_LEN * 4:
        raise InvalidArgument("routing_key too long")
    return StoredMessage(
        payload=msg.payload,
        publish_time=msg.publish_time,
        producer_id=producer_id,
        producer_name=producer_name,
        attributes=attrs,
        routing_key=routing_key,
        schema_id=msg.schema_id if msg.HasField("schema_id") else None,
        schema_version=msg.schema_version if msg.HasField("schema_version") else None,
    )


def wire_from_stored(
    message: StoredMessage, *, offset: int, topic: str, subscription: str, broker_addr: str
) -> pb.StreamMessage:
    """The StreamMessage a consumer receives; request_id carries the offset, msg_id the full identity."""
    out = pb.StreamMessage(
        request_id=offset,
        msg_id=pb.MsgID(
            producer_id=message.producer_id,
            topic_name=topic,
            broker_addr=broker_addr,
            topic_offset=offset,
        ),
        payload=message.payload,
        publish_time=message.publish_time,
        producer_name=message.producer_name,
        subscription_name=subscription,
        attributes=message.attributes,
    )
    if message.routing_key is not None:
        out.routing_key = message.routing_key
    if message.schema_id is not None:
        out.schema_id = message.schema_id
    if message.schema_version is not None:
        out.schema_version = message.schema_version
    return out
