"""Peek: stored records of a reliable topic from an offset or a publish time, decoded by their schema, on
the topic's owner. No subscription, no cursor: nothing moves (docs/admin.md, peek)."""

from __future__ import annotations

import base64
import json
import logging
from dataclasses import dataclass
from typing import Any

import msgspec

from ister.broker.cursors import Cursors, Position
from ister.broker.reads import OffsetReads
from ister.core.record import StoredMessage, decode_message
from ister.errors import InvalidArgument, IsterError
from ister.limits import MiB
from ister.schema.registry import SchemaRegistry

log = logging.getLogger(__name__)

MAX_PEEK = 1_000
DEFAULT_PEEK = 10
PEEK_MAX_BYTES = 16 * MiB  # per topic: a peek answer stays well under the 64 MiB gRPC limit


@dataclass(frozen=True, slots=True)
class Peeked:
    topic: str
    offset: int
    message: StoredMessage
    schema_subject: str = ""
    schema_type: str = ""
    value_json: str | None = None  # the payload decoded by its schema, as JSON
    decode_error: str = ""


def peek_count(count: int) -> int:
    if count == 0:
        return DEFAULT_PEEK
    if not 1 <= count <= MAX_PEEK:
        raise InvalidArgument(f"count {count} is outside 1..{MAX_PEEK}")
    return count


class Peeker:
    def __init__(self, reads: OffsetReads, cursors: Cursors, schemas: SchemaRegistry) -> None:
        self.reads = reads
        self.cursors = cursors
        self.schemas = schemas

    async def peek(self, topic_name: str, start: Position | None, count: int) -> list[Peeked]:
        """Up to `count` records of the topic (served here) from `start` (None: the earliest)."""
        count = peek_count(count)
        topic = await self.reads.reliable_topic(topic_name)
        assert topic.wal is not None
        head = topic.wal.committed_offset
        if start is not None and start.kind == "offset" and start.value > head:
            return []  # nothing there yet
        first = await self.cursors.resolve(topic, start or Position("earliest"))
        out: list[Peeked] = []
        batches = self.reads.read_range(topic.name.full, first, head, count, PEEK_MAX_BYTES)
        try:
            async for records in batches:
                for offset, record in records[: count - len(out)]:
                    out.append(await self._decoded(topic.name.full, offset, record))
                if len(out) >= count:
                    break
        finally:
            await batches.aclose()
        return out

    async def _decoded(self, topic: str, offset: int, record: bytes) -> Peeked:
        try:
            message = decode_message(record)
        except msgspec.DecodeError as exc:
            raw = StoredMessage(payload=bytes(record), publish_time=0, producer_id=0, producer_name="")
            return Peeked(topic, offset, raw, decode_error=f"the stored record does not decode: {exc}")
        if message.schema_id is None:
            return Peeked(topic, offset, message)
        try:
            view = await self.schemas.get(message.schema_id, message.schema_version)
        except IsterError as exc:
            return Peeked(topic, offset, message, decode_error=f"schema {message.schema_id}: {exc}")
        subject, kind = view.subject, view.schema.type.value
        try:
            value = view.schema.decode(message.payload)
            text = json.dumps(value, default=_jsonable, ensure_ascii=False)
        except Exception as exc:  # a payload stored under a warn policy, or not of this schema
            return Peeked(topic, offset, message, subject, kind, decode_error=f"{type(exc).__name__}: {exc}")
        return Peeked(topic, offset, message, subject, kind, value_json=text)


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode()
    return str(value)
