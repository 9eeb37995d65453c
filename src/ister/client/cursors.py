"""Moving a subscription's cursor from the client (Ister.SeekCursor on the topic's owner): to an offset, a
publish time (`datetime`), or "earliest" / "latest"; with consumers attached (they are moved)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from ister import errors
from ister.ids import TopicName, validate_client_name
from ister.wire.gen import ister_v1_pb2 as pb

if TYPE_CHECKING:
    from ister.client.client import Client

SEEK_TIMEOUT_SECONDS = 30.0
# The subscription name a time lookup's dry-run seek names (nothing is created or moved).
TIME_LOOKUP_SUBSCRIPTION = "ister-time-lookup"

SeekPosition = int | datetime | Literal["earliest", "latest"]


@dataclass(frozen=True, slots=True)
class CursorPosition:
    topic: str  # the concrete topic (partition)
    next: int  # the first offset delivered from now on
    head: int  # the topic's next offset when the cursor moved
    consumers: int  # attached consumers moved with it
    epoch: int  # the subscription's cursor epoch from now on


def time_ms(when: datetime) -> int:
    """Unix ms of `when` (a naive datetime is local time, as `datetime.timestamp` reads it)."""
    return int(when.timestamp() * 1000)


def seek_request(topic: str, subscription: str, position: SeekPosition) -> pb.ResetCursorRequest:
    TopicName.parse(topic)
    validate_client_name(subscription, "subscription name")
    request = pb.ResetCursorRequest(topic=topic, subscription=subscription)
    if isinstance(position, datetime):
        request.time_ms = time_ms(position)
    elif isinstance(position, bool) or not isinstance(position, int | str):
        raise errors.InvalidArgument(
            f"seek to an offset, a datetime, 'earliest' or 'latest', not {position!r}"
        )
    elif isinstance(position, int):
        if position < 0:
            raise errors.InvalidArgument(f"offset {position} is negative")
        request.offset = position
    elif position == "earliest":
        request.earliest = True
    elif position == "latest":
        request.latest = True
    else:
        raise errors.InvalidArgument(
            f"seek to an offset, a datetime, 'earliest' or 'latest', not {position!r}"
        )
    return request


async def seek(client: Client, topic: str, subscription: str, position: SeekPosition) -> CursorPosition:
    """Move `subscription` of the concrete `topic` (a partition of a partitioned one) to `position`,
    creating the subscription if needed."""
    request = seek_request(topic, subscription, position)

    async def call(stub: Any) -> Any:
        return await stub.SeekCursor(request, timeout=SEEK_TIMEOUT_SECONDS)

    resp = await client._on_owner(topic, call, "SeekCursor")
    p = resp.positions[0]
    return CursorPosition(p.topic, int(p.next), int(p.head), int(p.consumers), int(p.epoch))
