"""Cursor positions, cursor moves and peeked records between the wire (ister.v1) and the broker."""

from __future__ import annotations

from typing import Any

from ister.broker.cursors import CursorMove, Position
from ister.broker.peek import Peeked
from ister.errors import InvalidArgument
from ister.wire.gen import ister_v1_pb2 as pb


def position_from_wire(request: Any) -> Position:
    """The `position` oneof of a ResetCursorRequest; INVALID_ARGUMENT when none is set."""
    kind = request.WhichOneof("position")
    if kind == "earliest" and request.earliest:
        return Position("earliest")
    if kind == "latest" and request.latest:
        return Position("latest")
    if kind == "offset":
        return Position("offset", int(request.offset))
    if kind == "time_ms":
        return Position("time", int(request.time_ms))
    raise InvalidArgument("give a position: earliest, latest, an offset or a time")


def peek_start_from_wire(request: Any) -> Position | None:
    kind = request.WhichOneof("from")
    if kind == "offset":
        return Position("offset", int(request.offset))
    if kind == "time_ms":
        return Position("time", int(request.time_ms))
    return None


def move_to_wire(move: CursorMove) -> pb.CursorPosition:
    return pb.CursorPosition(
        topic=move.topic, next=move.next, head=move.head, consumers=move.consumers, epoch=move.epoch
    )


def peeked_to_wire(p: Peeked) -> pb.PeekedMessage:
    m = p.message
    out = pb.PeekedMessage(
        topic=p.topic,
        offset=p.offset,
        payload=m.payload,
        publish_time=m.publish_time,
        producer_name=m.producer_name,
        producer_id=m.producer_id,
        attributes=m.attributes,
        schema_subject=p.schema_subject,
        schema_type=p.schema_type,
        decode_error=p.decode_error,
    )
    if m.routing_key is not None:
        out.routing_key = m.routing_key
    if m.schema_id is not None:
        out.schema_id = m.schema_id
    if m.schema_version is not None:
        out.schema_version = m.schema_version
    if p.value_json is not None:
        out.value_json = p.value_json
    return out
