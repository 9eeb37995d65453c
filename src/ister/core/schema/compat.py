"""Compatibility of a new schema version with a subject's earlier versions, by mode.

BACKWARD: the new schema reads data written with the old one (reader = new, writer = old).
FORWARD: the old schema reads data written with the new one (reader = old, writer = new).
FULL: both. Plain modes compare with the latest version, `_TRANSITIVE` modes with every version.
A change of schema type is incompatible under every mode but NONE. JSON Schema subjects are compared
under `JsonRules` (DANUBE unless the subject or the broker says STRICT; `jsonschema.py`).
"""

from __future__ import annotations

from collections.abc import Sequence

from ister.core.schema.jsonschema import JsonSchema, json_can_read
from ister.core.schema.model import MAX_ERRORS, ParsedSchema
from ister.core.schema.types import DEFAULT_JSON_RULES, CompatibilityMode, JsonRules, SchemaType

# The Avro and Protobuf checkers are imported when a schema of their type is compared: their libraries
# cost ~0.3 s at every process start (ister.core.schema's lazy names). Only their classes have those types.


def can_read(
    reader: ParsedSchema, writer: ParsedSchema, json_rules: JsonRules = DEFAULT_JSON_RULES
) -> list[str]:
    """Why data written with `writer` cannot be read with `reader`; both of one type."""
    if reader.type is SchemaType.AVRO:
        from ister.core.schema.avro import AvroSchema, avro_can_read

        if isinstance(reader, AvroSchema) and isinstance(writer, AvroSchema):
            return avro_can_read(reader, writer)
    if isinstance(reader, JsonSchema) and isinstance(writer, JsonSchema):
        return json_can_read(reader, writer, json_rules)
    if reader.type is SchemaType.PROTOBUF:
        from ister.core.schema.protobuf import ProtobufSchema, proto_can_read

        if isinstance(reader, ProtobufSchema) and isinstance(writer, ProtobufSchema):
            return proto_can_read(reader, writer)
    return []  # bytes, string, number: one type reads its own data


def evolution_errors(old: ParsedSchema, new: ParsedSchema) -> list[str]:
    """Changes refused in either direction (Protobuf numbers removed unreserved or reused)."""
    if old.type is SchemaType.PROTOBUF:
        from ister.core.schema.protobuf import ProtobufSchema, proto_evolution_errors

        if isinstance(old, ProtobufSchema) and isinstance(new, ProtobufSchema):
            return proto_evolution_errors(old, new)
    return []


def check(
    new: ParsedSchema,
    history: Sequence[tuple[int, ParsedSchema]],
    mode: CompatibilityMode,
    json_rules: JsonRules = DEFAULT_JSON_RULES,
) -> list[str]:
    """Errors that make `new` incompatible with the subject's `history` ((version, schema), oldest first)
    under `mode`; empty when compatible."""
    if mode is CompatibilityMode.NONE or not history:
        return []
    against = history if mode.transitive else history[-1:]
    errors: list[str] = []
    for version, old in reversed(against):
        if old.type is not new.type:
            errors.append(
                f"version {version} is {old.type.value}, this schema is {new.type.value}: "
                "a subject's type changes only under compatibility mode none"
            )
            continue
        found = [f"evolution: {e}" for e in evolution_errors(old, new)]
        if mode.backward:
            found += [f"backward: {e}" for e in can_read(new, old, json_rules)]
        if mode.forward:
            found += [f"forward: {e}" for e in can_read(old, new, json_rules)]
        errors += [f"against version {version}, {e}" for e in found]
    if len(errors) > MAX_ERRORS:
        errors = [*errors[:MAX_ERRORS], f"… and {len(errors) - MAX_ERRORS} more"]
    return errors
