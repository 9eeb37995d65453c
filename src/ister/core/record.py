"""The record stored in a WAL frame's payload: one published message, encoded with msgpack (msgspec)."""

from __future__ import annotations

import msgspec


class StoredMessage(msgspec.Struct, array_like=True, frozen=True):
    """A published message as persisted. The offset lives in the frame header, not here."""

    payload: bytes
    publish_time: int  # unix milliseconds, as the client sent it
    producer_id: int
    producer_name: str
    attributes: dict[str, str] = {}
    routing_key: str | None = None
    schema_id: int | None = None
    schema_version: int | None = None

    @property
    def key(self) -> str:
        """The Key-Shared routing key: routing_key, falling back to the producer name (as Danube)."""
        return self.routing_key if self.routing_key is not None else self.producer_name


NO_ATTRIBUTES = msgspec.Raw(b"\x80")  # an empty msgpack map


class LeanMessage(msgspec.Struct, array_like=True, frozen=True):
    """A stored record decoded with its attributes left as raw msgpack: building a dict per record is the
    largest part of a decode, and most readers need the attributes only when a record has some (the
    broker's publish checks, Spark rows without a headers column)."""

    payload: bytes
    publish_time: int
    producer_id: int
    producer_name: str
    attributes: msgspec.Raw = NO_ATTRIBUTES
    routing_key: str | None = None
    schema_id: int | None = None
    schema_version: int | None = None


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(StoredMessage)


def encode_message(message: StoredMessage) -> bytes:
    return _encoder.encode(message)


def decode_message(data: bytes | memoryview) -> StoredMessage:
    """Decode a stored record; raises msgspec.DecodeError on garbage (callers map it to CorruptionError)."""
    return _decoder.decode(data)
