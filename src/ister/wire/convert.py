"""Conversions between the Danube wire messages and Ister's core records."""

from __future__ import annotations

from ister.core.record import StoredMessage, check_attributes, check_routing_key
from ister.wire.gen import DanubeApi_pb2 as pb


def stored_from_wire(msg: pb.StreamMessage, producer_id: int, producer_name: str) -> StoredMessage:
    """Validate the client-supplied parts of a StreamMessage and build the record to persist.

    The rules are the batch API's (`ister.core.record`); the integer fields' types are the wire's ranges."""
    attrs = dict(msg.attributes)
    check_attributes(attrs)
    routing_key = msg.routing_key if msg.HasField("routing_key") else None
    check_routing_key(routing_key)
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
