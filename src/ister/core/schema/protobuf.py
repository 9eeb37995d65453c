"""Protobuf: a `.proto` definition compiled to descriptors (by protoc, outside this pure module), payloads
validated by decoding them with the schema's message class, compatibility decided on the descriptors.

The schema's message is the first message the file defines (as Confluent's registry does). Rules, from the
Protobuf language guide's "updating a message type" and the wire format:

- a field number kept in both versions keeps a compatible wire encoding: int32/uint32/int64/uint64/bool/
  enum are interchangeable varints, sint32/sint64 zigzag varints, fixed32/sfixed32, fixed64/sfixed64,
  string/bytes; float, double, group and message types stand alone, and message fields are compared
  recursively; a field does not change between repeated and singular;
- a field removed has its number reserved in the new version, and a new field does not reuse a number or
  name the old version reserved (else old and new data would disagree about what the number means);
  the same for enum values;
- a `required` (proto2) field the reader expects is one the writer always writes;
- fields that could be set together in the writer are not moved into one oneof of the reader (setting one
  clears the others): no field moved into an existing oneof, no two fields moved into a new one.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from google.protobuf import (  # type: ignore[import-untyped]
    descriptor_pb2,
    descriptor_pool,
    text_format,
)
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
from google.protobuf.message_factory import GetMessageClass  # type: ignore[import-untyped]

from ister.core.schema.model import ParsedSchema, sha256_fingerprint
from ister.core.schema.types import SchemaType
from ister.errors import InvalidArgument
from ister.ids import clip, shown

F = descriptor_pb2.FieldDescriptorProto
_WIRE_CLASS = {
    F.TYPE_INT32: "varint",
    F.TYPE_INT64: "varint",
    F.TYPE_UINT32: "varint",
    F.TYPE_UINT64: "varint",
    F.TYPE_BOOL: "varint",
    F.TYPE_ENUM: "varint",
    F.TYPE_SINT32: "zigzag",
    F.TYPE_SINT64: "zigzag",
    F.TYPE_FIXED32: "fixed32",
    F.TYPE_SFIXED32: "fixed32",
    F.TYPE_FIXED64: "fixed64",
    F.TYPE_SFIXED64: "fixed64",
    F.TYPE_FLOAT: "float",
    F.TYPE_DOUBLE: "double",
    F.TYPE_STRING: "text",
    F.TYPE_BYTES: "text",
    F.TYPE_MESSAGE: "message",
    F.TYPE_GROUP: "group",
}
_TYPE_NAMES = {v: k.removeprefix("TYPE_").lower() for k, v in F.Type.items()}


def _type_text(field: Any) -> str:
    if field.type in (F.TYPE_MESSAGE, F.TYPE_ENUM):
        return str(field.type_name).lstrip(".")
    return str(_TYPE_NAMES.get(field.type, field.type))


class ProtobufSchema(ParsedSchema):
    def __init__(self, raw: str, descriptor_set: bytes, file_name: str) -> None:
        self.type = SchemaType.PROTOBUF
        self.raw = raw
        fds = descriptor_pb2.FileDescriptorSet()
        try:
            fds.ParseFromString(descriptor_set)
        except DecodeError:
            raise InvalidArgument("invalid Protobuf schema: the compiled descriptors do not parse") from None
        main = next((f for f in fds.file if f.name == file_name), None)
        if main is None or not main.message_type:
            raise InvalidArgument("invalid Protobuf schema: the definition declares no message")
        self.files = list(fds.file)
        package = f".{main.package}" if main.package else ""
        self.message_name = f"{package}.{main.message_type[0].name}".lstrip(".")
        self.messages: dict[str, Any] = {}
        self.enums: dict[str, Any] = {}
        for file in fds.file:
            prefix = f".{file.package}" if file.package else ""
            for message in file.message_type:
                self._index(prefix, message)
            for enum in file.enum_type:
                self.enums[f"{prefix}.{enum.name}"] = enum
        pool = descriptor_pool.DescriptorPool()
        try:
            for file in fds.file:
                pool.Add(file)
            self._class = GetMessageClass(pool.FindMessageTypeByName(self.message_name))
        except (TypeError, KeyError, ValueError) as exc:
            raise InvalidArgument(f"invalid Protobuf schema: {clip(str(exc))}") from None
        normal = descriptor_pb2.FileDescriptorProto()
        normal.CopyFrom(main)
        normal.ClearField("source_code_info")
        normal.name = "schema.proto"
        self.canonical = text_format.MessageToString(normal, as_one_line=True)
        self.fingerprint = sha256_fingerprint(self.canonical)

    def _index(self, prefix: str, message: Any) -> None:
        name = f"{prefix}.{message.name}"
        self.messages[name] = message
        for nested in message.nested_type:
            self._index(name, nested)
        for enum in message.enum_type:
            self.enums[f"{name}.{enum.name}"] = enum

    @property
    def message_class(self) -> Any:
        """The generated class of the schema's message (`FromString` decodes a payload)."""
        return self._class

    @property
    def root(self) -> str:
        return "." + self.message_name

    def validate(self, payload: bytes) -> str | None:
        try:
            self._class.FromString(payload)
        except DecodeError as exc:
            return f"not a {self.message_name} message: {clip(str(exc))}"
        except Exception as exc:  # the parser's other complaints (recursion depth, …)
            return f"not a {self.message_name} message: {clip(str(exc))}"
        return None

    def encode(self, value: Any) -> bytes:
        from google.protobuf.json_format import ParseDict, ParseError  # type: ignore[import-untyped]

        try:
            return bytes(ParseDict(value, self._class()).SerializeToString())
        except (ParseError, TypeError, ValueError, AttributeError) as exc:
            raise InvalidArgument(f"not a {self.message_name} value: {clip(str(exc))}") from None

    def decode(self, payload: bytes) -> Any:
        from google.protobuf.json_format import MessageToDict

        return MessageToDict(self._class.FromString(payload), preserving_proto_field_name=True)

    def envelope(self) -> Any:
        return {
            "Protobuf": {
                "raw_proto": self.raw,
                "message_name": self.message_name,
                "fingerprint": self.fingerprint,
            }
        }


def _reserved(message: Any, number: int, name: str) -> bool:
    return any(r.start <= number < r.end for r in message.reserved_range) or name in message.reserved_name


def _enum_reserved(enum: Any, number: int, name: str) -> bool:
    # enum reserved ranges are inclusive at both ends
    return any(r.start <= number <= r.end for r in enum.reserved_range) or name in enum.reserved_name


def _oneof(message: Any, field: Any) -> int | None:
    if field.HasField("oneof_index") and not field.proto3_optional:
        return int(field.oneof_index)
    return None


def _pairs(old: ProtobufSchema, new: ProtobufSchema) -> Iterator[tuple[str, Any, str, Any]]:
    """(old name, old message, new name, new message) for the root and every message reached from it
    through fields kept in both versions."""
    seen: set[tuple[str, str]] = set()
    todo = [(old.root, new.root)]
    while todo:
        o_name, n_name = todo.pop()
        if (o_name, n_name) in seen:
            continue
        seen.add((o_name, n_name))
        o_msg, n_msg = old.messages.get(o_name), new.messages.get(n_name)
        if o_msg is None or n_msg is None:
            continue
        yield o_name, o_msg, n_name, n_msg
        n_fields = {f.number: f for f in n_msg.field}
        for o_field in o_msg.field:
            n_field = n_fields.get(o_field.number)
            if n_field is not None and o_field.type == n_field.type == F.TYPE_MESSAGE:
                todo.append((o_field.type_name, n_field.type_name))


def _enum_pairs(old: ProtobufSchema, new: ProtobufSchema) -> Iterator[tuple[str, Any, Any]]:
    for _, o_msg, _, n_msg in _pairs(old, new):
        n_fields = {f.number: f for f in n_msg.field}
        for o_field in o_msg.field:
            n_field = n_fields.get(o_field.number)
            if n_field is not None and o_field.type == n_field.type == F.TYPE_ENUM:
                o_enum, n_enum = old.enums.get(o_field.type_name), new.enums.get(n_field.type_name)
                if o_enum is not None and n_enum is not None:
                    yield o_field.type_name.lstrip("."), o_enum, n_enum


def proto_evolution_errors(old: ProtobufSchema, new: ProtobufSchema) -> list[str]:
    """Changes that break old or new data whichever side reads: numbers removed without a reservation,
    reserved numbers or names reused."""
    out: list[str] = []
    for o_name, o_msg, _, n_msg in _pairs(old, new):
        where = o_name.lstrip(".")
        n_numbers = {f.number for f in n_msg.field}
        for f in o_msg.field:
            if f.number not in n_numbers and not _reserved(n_msg, f.number, f.name):
                out.append(
                    f"{where}: field {f.number} ({shown(f.name)}) removed without reserving its number"
                )
        o_numbers = {f.number for f in o_msg.field}
        for f in n_msg.field:
            if f.number not in o_numbers and _reserved(o_msg, f.number, f.name):
                out.append(
                    f"{where}: field {f.number} ({shown(f.name)}) reuses a number or name reserved before"
                )
    for where, o_enum, n_enum in _enum_pairs(old, new):
        n_values = {v.number for v in n_enum.value}
        for v in o_enum.value:
            if v.number not in n_values and not _enum_reserved(n_enum, v.number, v.name):
                out.append(f"{where}: enum value {v.number} ({shown(v.name)}) removed without reserving it")
    return out


def proto_can_read(reader: ProtobufSchema, writer: ProtobufSchema) -> list[str]:
    """Why messages written with `writer` may be misread under `reader` (empty: they are read right)."""
    out: list[str] = []
    if writer.message_name.rsplit(".", 1)[-1] != reader.message_name.rsplit(".", 1)[-1]:
        out.append(f"message {writer.message_name} became {reader.message_name}")
    for w_name, w_msg, _, r_msg in _pairs(writer, reader):
        where = w_name.lstrip(".")
        w_fields = {f.number: f for f in w_msg.field}
        for r_field in r_msg.field:
            w_field = w_fields.get(r_field.number)
            if w_field is None:
                if r_field.label == F.LABEL_REQUIRED:
                    out.append(f"{where}: required field {shown(r_field.name)} is not written by the writer")
                continue
            out.extend(_field_errors(where, r_field, w_field))
            if r_field.label == F.LABEL_REQUIRED and w_field.label != F.LABEL_REQUIRED:
                out.append(f"{where}: field {shown(r_field.name)} became required")
        out.extend(_oneof_errors(where, r_msg, w_fields))
    return out


def _field_errors(where: str, r: Any, w: Any) -> list[str]:
    label = f"{where}: field {r.number} ({shown(r.name)})"
    out = []
    if _WIRE_CLASS.get(r.type) != _WIRE_CLASS.get(w.type):
        out.append(f"{label} changed type from {_type_text(w)} to {_type_text(r)} (wire encoding differs)")
    elif r.type == F.TYPE_MESSAGE and r.type_name.rsplit(".", 1)[-1] != w.type_name.rsplit(".", 1)[-1]:
        out.append(f"{label} changed message type from {_type_text(w)} to {_type_text(r)}")
    if (r.label == F.LABEL_REPEATED) != (w.label == F.LABEL_REPEATED):
        out.append(f"{label} changed between repeated and singular")
    return out


def _oneof_errors(where: str, r_msg: Any, w_fields: dict[int, Any]) -> list[str]:
    out = []
    groups: dict[int, list[Any]] = {}
    for f in r_msg.field:
        index = _oneof(r_msg, f)
        if index is not None and f.number in w_fields:
            groups.setdefault(index, []).append(f)
    for index, fields in groups.items():
        independent: set[object] = set()
        for f in fields:
            w_index = _oneof(None, w_fields[f.number])
            independent.add(("oneof", w_index) if w_index is not None else ("field", f.number))
        if len(independent) > 1:
            names = ", ".join(shown(f.name) for f in fields)
            out.append(
                f"{where}: fields {names} moved into oneof {shown(r_msg.oneof_decl[index].name)} "
                "although the writer may set them together"
            )
    return out
