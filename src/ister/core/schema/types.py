"""Names of the registry's vocabularies: schema types, compatibility modes, topic validation policies.

They travel as strings on the Danube wire (`danube_schema`), case-insensitive on input; the spellings
returned follow Danube (types and modes lowercase on the wire, capitalised in stored metadata).
"""

from __future__ import annotations

from enum import Enum

from ister.errors import InvalidArgument
from ister.ids import shown


class SchemaType(Enum):
    BYTES = "bytes"
    STRING = "string"
    NUMBER = "number"
    AVRO = "avro"
    JSON_SCHEMA = "json_schema"
    PROTOBUF = "protobuf"

    @property
    def is_primitive(self) -> bool:
        return self in (SchemaType.BYTES, SchemaType.STRING, SchemaType.NUMBER)

    @property
    def envelope_tag(self) -> str:
        """The tag of Danube's stored `schema_def` (`"Bytes"`, `{"Avro": …}`, …)."""
        return _TAGS[self]


_TAGS = {
    SchemaType.BYTES: "Bytes",
    SchemaType.STRING: "String",
    SchemaType.NUMBER: "Number",
    SchemaType.AVRO: "Avro",
    SchemaType.JSON_SCHEMA: "JsonSchema",
    SchemaType.PROTOBUF: "Protobuf",
}

_TYPE_ALIASES = {
    "bytes": SchemaType.BYTES,
    "string": SchemaType.STRING,
    "number": SchemaType.NUMBER,
    "int64": SchemaType.NUMBER,
    "int": SchemaType.NUMBER,
    "float": SchemaType.NUMBER,
    "double": SchemaType.NUMBER,
    "avro": SchemaType.AVRO,
    "json_schema": SchemaType.JSON_SCHEMA,
    "jsonschema": SchemaType.JSON_SCHEMA,
    "json": SchemaType.JSON_SCHEMA,
    "protobuf": SchemaType.PROTOBUF,
    "proto": SchemaType.PROTOBUF,
}


def parse_schema_type(text: str) -> SchemaType:
    found = _TYPE_ALIASES.get(text.strip().lower())
    if found is None:
        raise InvalidArgument(
            f"unknown schema type {shown(text)}: "
            "expected bytes, string, number, avro, json_schema or protobuf"
        )
    return found


class CompatibilityMode(Enum):
    """Which earlier versions a new version must stay compatible with, and in which direction.

    BACKWARD: consumers on the new schema read data written with the old one.
    FORWARD: consumers on the old schema read data written with the new one.
    FULL: both. The `_TRANSITIVE` forms check every earlier version, the plain forms only the latest.
    """

    NONE = "none"
    BACKWARD = "backward"
    FORWARD = "forward"
    FULL = "full"
    BACKWARD_TRANSITIVE = "backward_transitive"
    FORWARD_TRANSITIVE = "forward_transitive"
    FULL_TRANSITIVE = "full_transitive"

    @property
    def backward(self) -> bool:
        return self in _BACKWARD

    @property
    def forward(self) -> bool:
        return self in _FORWARD

    @property
    def transitive(self) -> bool:
        return self.value.endswith("_transitive")

    @property
    def stored(self) -> str:
        """The spelling in `/schemas/{subject}/metadata` (Danube's enum names: `Backward`, …)."""
        return "".join(part.capitalize() for part in self.value.split("_"))


_M = CompatibilityMode
_BACKWARD = frozenset({_M.BACKWARD, _M.FULL, _M.BACKWARD_TRANSITIVE, _M.FULL_TRANSITIVE})
_FORWARD = frozenset({_M.FORWARD, _M.FULL, _M.FORWARD_TRANSITIVE, _M.FULL_TRANSITIVE})
DEFAULT_MODE = CompatibilityMode.BACKWARD


def parse_mode(text: str) -> CompatibilityMode:
    """Any case; `-`, `_` or nothing between the words (`FullTransitive`, `full-transitive`)."""
    key = text.strip().lower().replace("-", "_")
    for mode in CompatibilityMode:
        if key in (mode.value, mode.value.replace("_", "")):
            return mode
    raise InvalidArgument(
        f"unknown compatibility mode {shown(text)}: expected none, backward, forward, full "
        "or backward_transitive, forward_transitive, full_transitive"
    )


class JsonRules(Enum):
    """How JSON Schema compatibility reads a property that one side's schema does not list.

    DANUBE (the default, what Danube and its users expect): data holds only the properties its writer's
    schema lists, so adding or removing an optional property is compatible (backward and forward).
    STRICT (Confluent's open content model): an object without `additionalProperties: false` may hold any
    other property with any value, so adding a constrained property to an open object is not backward
    compatible, and removing one is not forward compatible.
    Both refuse a new required property, a changed or narrowed type, a removed enum value and a tighter
    bound, at every depth (nested objects, array items, $defs).
    """

    DANUBE = "danube"
    STRICT = "strict"


DEFAULT_JSON_RULES = JsonRules.DANUBE


def parse_json_rules(text: str) -> JsonRules:
    try:
        return JsonRules(text.strip().lower())
    except ValueError:
        raise InvalidArgument(
            f"unknown JSON compatibility rules {shown(text)}: expected danube or strict"
        ) from None


def parse_mode_and_rules(text: str) -> tuple[CompatibilityMode, JsonRules | None]:
    """A compatibility mode, optionally followed by `:danube` or `:strict` (the JSON rules; Ister's
    extension of the Danube wire's mode string, which Danube's clients never send)."""
    mode_text, sep, rules_text = text.partition(":")
    return parse_mode(mode_text), parse_json_rules(rules_text) if sep else None


class ValidationPolicy(Enum):
    NONE = "none"
    WARN = "warn"
    ENFORCE = "enforce"

    @property
    def stored(self) -> str:
        return self.value.capitalize()


def parse_policy(text: str) -> ValidationPolicy:
    try:
        return ValidationPolicy(text.strip().lower())
    except ValueError:
        raise InvalidArgument(
            f"unknown validation policy {shown(text)}: expected none, warn or enforce"
        ) from None
