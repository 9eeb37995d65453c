"""Schema registry logic without I/O: schema types, normalisation and fingerprints, payload validators,
and compatibility rules per type and mode. Protobuf definitions arrive compiled to descriptors
(`ister.schema.protoc` runs the compiler)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ister.core.schema.jsonschema import JsonSchema
from ister.core.schema.model import MAX_SCHEMA_BYTES, ParsedSchema
from ister.core.schema.primitive import PrimitiveSchema
from ister.core.schema.types import (
    DEFAULT_JSON_RULES,
    DEFAULT_MODE,
    CompatibilityMode,
    JsonRules,
    SchemaType,
    ValidationPolicy,
    parse_json_rules,
    parse_mode,
    parse_mode_and_rules,
    parse_policy,
    parse_schema_type,
)
from ister.errors import InvalidArgument

if TYPE_CHECKING:
    from ister.core.schema.avro import AvroSchema
    from ister.core.schema.compat import can_read, check
    from ister.core.schema.protobuf import ProtobufSchema

# avro/fastavro and protobuf's descriptor_pb2 take ~0.3 s of CPU to import, and every broker and CLI start
# imports this package while only schema work needs them: these names load on first use (PEP 562).
_LAZY = {
    "AvroSchema": "ister.core.schema.avro",
    "ProtobufSchema": "ister.core.schema.protobuf",
    "can_read": "ister.core.schema.compat",
    "check": "ister.core.schema.compat",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


PROTO_FILE_NAME = "schema.proto"

__all__ = [
    "DEFAULT_JSON_RULES",
    "DEFAULT_MODE",
    "MAX_SCHEMA_BYTES",
    "PROTO_FILE_NAME",
    "AvroSchema",
    "CompatibilityMode",
    "JsonRules",
    "JsonSchema",
    "ParsedSchema",
    "PrimitiveSchema",
    "ProtobufSchema",
    "SchemaType",
    "ValidationPolicy",
    "can_read",
    "check",
    "definition_text",
    "parse",
    "parse_json_rules",
    "parse_mode",
    "parse_mode_and_rules",
    "parse_policy",
    "parse_schema_type",
]


def definition_text(schema_type: SchemaType, definition: bytes) -> str:
    """The definition as text: UTF-8, at most MAX_SCHEMA_BYTES; empty for the primitive types."""
    if schema_type.is_primitive:
        return ""
    if not definition.strip():
        raise InvalidArgument(f"a {schema_type.value} schema needs a definition")
    if len(definition) > MAX_SCHEMA_BYTES:
        raise InvalidArgument(f"schema definition of {len(definition)} bytes exceeds {MAX_SCHEMA_BYTES}")
    try:
        return definition.decode()
    except UnicodeDecodeError:
        raise InvalidArgument("schema definition is not UTF-8 text") from None


def parse(schema_type: SchemaType, text: str, compiled_proto: bytes | None = None) -> ParsedSchema:
    """Parse and compile a definition; InvalidArgument naming what is wrong. A Protobuf definition needs
    its descriptors (`compiled_proto`, a FileDescriptorSet of PROTO_FILE_NAME and its imports)."""
    if schema_type.is_primitive:
        return PrimitiveSchema(schema_type)
    if schema_type is SchemaType.AVRO:
        from ister.core.schema.avro import AvroSchema

        return AvroSchema(text)
    if schema_type is SchemaType.JSON_SCHEMA:
        return JsonSchema(text)
    if compiled_proto is None:
        raise InvalidArgument("a Protobuf schema must be compiled before it is parsed")
    from ister.core.schema.protobuf import ProtobufSchema

    return ProtobufSchema(text, compiled_proto, PROTO_FILE_NAME)
