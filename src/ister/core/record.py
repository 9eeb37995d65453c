"""The record stored in a WAL frame's payload: one published message, encoded with msgpack (msgspec).

This module also holds the one validation of a published message, used by both client APIs (the Danube
services and the batch API) and by the Ister client before it sends: every field must fit the wire's
ranges (the Danube StreamMessage a consumer receives) and the broker's limits, so that whatever is stored
can be delivered.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, TypeVar

import msgspec

from ister.core.compression import (
    MARK,
    CompressionError,
    dictionary_of,
    envelope,
    plain,
    unwrap,
    wrap,
    wrap_with_dictionary,
)
from ister.errors import InvalidArgument
from ister.ids import clip
from ister.limits import MAX_ATTRIBUTE_BYTES, MAX_ATTRIBUTES, MAX_ROUTING_KEY_CHARS, U32_MAX, U64_MAX


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


class _Stamp(msgspec.Struct, array_like=True, frozen=True):
    """The first two fields of a stored record (the rest are not decoded)."""

    payload: msgspec.Raw
    publish_time: int


_encoder = msgspec.msgpack.Encoder()
_stamp = msgspec.msgpack.Decoder(_Stamp)


def publish_time_of(data: bytes | memoryview | msgspec.Raw) -> int | None:
    """A stored record's publish time (unix ms) without decoding the rest; None when it does not decode."""
    try:
        return _stamp.decode(plain(data)).publish_time
    except (msgspec.DecodeError, TypeError, CompressionError):
        return None


_decoder = msgspec.msgpack.Decoder(StoredMessage)


def encode_message(message: StoredMessage) -> bytes:
    return _encoder.encode(message)


def decode_message(data: bytes | memoryview) -> StoredMessage:
    """Decode a stored record, plain or compressed; raises msgspec.DecodeError on garbage (callers map it to
    CorruptionError), a compressed record that does not decompress included."""
    try:
        return _decoder.decode(plain(data))
    except CompressionError as exc:
        raise msgspec.DecodeError(str(exc)) from None


# -- validation of published records -------------------------------------------------------------------------
# Reading stays lenient (StoredMessage, LeanMessage): a record stored before a rule existed must still be
# readable. Publishing decodes with these subclasses, whose fields carry the wire's ranges, so msgspec checks
# them in C while decoding. msgpack integers are at most 2**64 - 1, so `ge=0` is the whole u64 range.
U64 = Annotated[int, msgspec.Meta(ge=0)]
U32 = Annotated[int, msgspec.Meta(ge=0, le=U32_MAX)]
RoutingKey = Annotated[str, msgspec.Meta(max_length=MAX_ROUTING_KEY_CHARS)]
Attributes = Annotated[dict[str, str], msgspec.Meta(max_length=MAX_ATTRIBUTES)]
T = TypeVar("T")


class PublishedMessage(StoredMessage, array_like=True, frozen=True, forbid_unknown_fields=True):
    """A StoredMessage as a client publishes it: every field within the wire's ranges, nothing extra."""

    publish_time: U64
    producer_id: U64
    attributes: Attributes = {}
    routing_key: RoutingKey | None = None
    schema_id: U64 | None = None
    schema_version: U32 | None = None


class PublishedLean(LeanMessage, array_like=True, frozen=True, forbid_unknown_fields=True):
    """A LeanMessage as a client publishes it (attributes are checked by `check_attributes`)."""

    publish_time: U64
    producer_id: U64
    routing_key: RoutingKey | None = None
    schema_id: U64 | None = None
    schema_version: U32 | None = None


_published = msgspec.msgpack.Decoder(list[PublishedMessage])
_published_lean = msgspec.msgpack.Decoder(list[PublishedLean])
_raw_records = msgspec.msgpack.Decoder(list[msgspec.Raw])
_attributes = msgspec.msgpack.Decoder(dict[str, str])


def _decode(decoder: msgspec.msgpack.Decoder[list[T]], data: bytes) -> tuple[list[T], list[msgspec.Raw]]:
    try:
        records = decoder.decode(data)
        raws = _raw_records.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:  # invalid UTF-8 in a str: UnicodeDecodeError
        raise InvalidArgument(f"malformed records: {clip(str(exc))}") from None
    except RecursionError:
        raise InvalidArgument("malformed records: msgpack nested too deeply") from None
    return records, raws


def decode_published(data: bytes) -> tuple[list[PublishedMessage], list[msgspec.Raw]]:
    """Decode a client's msgpack array of records, checking every field's type and range; returns the
    records and each one's raw bytes. InvalidArgument on anything malformed (nesting too deep included).
    Attributes are checked for count and type here; their byte size by `check_attributes`."""
    return _decode(_published, data)


def decode_published_lean(data: bytes) -> tuple[list[PublishedLean], list[msgspec.Raw]]:
    """As `decode_published`, with attributes left raw: check them with `check_attributes`."""
    return _decode(_published_lean, data)


def check_routing_key(key: str | None) -> None:
    if key is not None and len(key) > MAX_ROUTING_KEY_CHARS:
        raise InvalidArgument(f"routing_key of {len(key)} characters exceeds {MAX_ROUTING_KEY_CHARS}")


def check_attributes(attributes: Mapping[str, str] | msgspec.Raw) -> None:
    """At most MAX_ATTRIBUTES names, str -> str, at most MAX_ATTRIBUTE_BYTES of UTF-8 altogether.

    Takes a dict or a record's raw msgpack map (decoded here; a short one needs no byte count, as its
    strings' UTF-8 is shorter than the map itself)."""
    count_bytes = True
    if isinstance(attributes, msgspec.Raw):
        if attributes == NO_ATTRIBUTES:
            return
        count_bytes = len(attributes) > MAX_ATTRIBUTE_BYTES
        try:
            attributes = _attributes.decode(attributes)
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            raise InvalidArgument(f"malformed attributes: {clip(str(exc))}") from None
        except RecursionError:
            raise InvalidArgument("malformed attributes: msgpack nested too deeply") from None
    if len(attributes) > MAX_ATTRIBUTES:
        raise InvalidArgument(f"too many attributes: {len(attributes)} > {MAX_ATTRIBUTES}")
    if not count_bytes:
        return
    size = 0
    for k, v in attributes.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise InvalidArgument("attribute names and values must be strings")
        size += len(k.encode()) + len(v.encode())
    if size > MAX_ATTRIBUTE_BYTES:
        raise InvalidArgument(f"attributes exceed {MAX_ATTRIBUTE_BYTES} bytes: {size} bytes of UTF-8")


def repair_for_wire(message: StoredMessage) -> StoredMessage:
    """The message with integer fields outside the wire's ranges cleared (0, or absent when optional).

    For records stored before publishing checked them: their dead letter must be deliverable."""
    t, pid, sid, sv = message.publish_time, message.producer_id, message.schema_id, message.schema_version
    ok_t, ok_pid = 0 <= t <= U64_MAX, 0 <= pid <= U64_MAX
    ok_sid = sid is None or 0 <= sid <= U64_MAX
    ok_sv = sv is None or 0 <= sv <= U32_MAX
    if ok_t and ok_pid and ok_sid and ok_sv:
        return message
    return msgspec.structs.replace(
        message,
        publish_time=t if ok_t else 0,
        producer_id=pid if ok_pid else 0,
        schema_id=sid if ok_sid else None,
        schema_version=sv if ok_sv else None,
    )


def array_header(n: int) -> bytes:
    """The msgpack header of an array of `n` elements: records joined behind it decode as one list (a
    batch's records, a run read back for export)."""
    if n < 16:
        return (0x90 | n).to_bytes(1, "big")
    if n < 0x10000:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


# -- idempotence tags ---------------------------------------------------------------------------------------
# The broker marks the first record of each batch an idempotent producer published with a 9th element,
# [producer_key, first_sequence, count] (docs/formats.md, "Idempotence tag"): the dedup table is rebuilt
# from the log after a restart, move or failover. Readers of records ignore the extra element (msgspec
# array_like structs skip trailing elements), so older readers and Danube consumers are unaffected.
_NIL = b"\xc0"
RECORD_FIELDS = 8
_DEFAULTS = b"\x80" + _NIL * 3  # fields 4..7 when absent: attributes {}, routing key, schema id, version


class _Tagged(msgspec.Struct, array_like=True, frozen=True):
    f0: msgspec.Raw
    f1: msgspec.Raw
    f2: msgspec.Raw
    f3: msgspec.Raw
    f4: msgspec.Raw = NO_ATTRIBUTES
    f5: msgspec.Raw = msgspec.Raw(_NIL)
    f6: msgspec.Raw = msgspec.Raw(_NIL)
    f7: msgspec.Raw = msgspec.Raw(_NIL)
    idem: tuple[int, int, int] | None = None


_tagged = msgspec.msgpack.Decoder(_Tagged)


def tag_record(record: bytes | msgspec.Raw, key: int, first_seq: int, count: int) -> bytes:
    """A published record (a msgpack array of at most 8 elements, checked by `decode_published*`) with the
    idempotence tag appended as its 9th element (missing optional fields padded with nil). A compressed
    record is tagged inside and compressed again with its codec."""
    data = bytes(record)
    head = data[0]
    if head == MARK:
        codec, _ = envelope(data)
        tagged = tag_record(unwrap(data), key, first_seq, count)
        dict_id = dictionary_of(data)  # compressed again with the same dictionary (it was loaded to unwrap)
        return wrap_with_dictionary(dict_id, tagged) if dict_id else wrap(codec, tagged)
    if 0x90 <= head <= 0x9F:
        n, body = head & 0x0F, data[1:]
    elif head == 0xDC:
        n, body = int.from_bytes(data[1:3], "big"), data[3:]
    elif head == 0xDD:
        n, body = int.from_bytes(data[1:5], "big"), data[5:]
    else:
        raise InvalidArgument("a record must be a msgpack array")
    if not 4 <= n <= RECORD_FIELDS:
        raise InvalidArgument(f"a record has 4 to {RECORD_FIELDS} fields, not {n}")
    pad = _DEFAULTS[n - 4 :] if n < RECORD_FIELDS else b""  # n >= 4: the first four are required
    return b"\x99" + body + pad + _encoder.encode((key, first_seq, count))


def idem_tag_of(data: bytes | memoryview) -> tuple[int, int, int] | None:
    """A stored record's idempotence tag (producer_key, first_sequence, count), or None (untagged or not
    decodable)."""
    try:
        return _tagged.decode(plain(data)).idem
    except (msgspec.DecodeError, TypeError, ValueError, CompressionError):
        return None
