"""The stored JSON of the registry (the key layout of docs/metadata.md, plus what Ister needs to rebuild a
schema without re-compiling it) and the values the registry answers with."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

from ister.core.schema import (
    CompatibilityMode,
    JsonRules,
    ParsedSchema,
    SchemaType,
    ValidationPolicy,
    parse,
    parse_json_rules,
    parse_mode,
    parse_policy,
    parse_schema_type,
)
from ister.errors import CorruptionError, InvalidArgument

MAX_VERSIONS_PER_SUBJECT = 1_000
MAX_TAGS = 32
MAX_TEXT_FIELD = 1_024  # description, created_by, each tag


@dataclass(frozen=True, slots=True)
class VersionView:
    """One version of a subject, as GetSchema answers it."""

    schema_id: int
    subject: str
    version: int
    schema: ParsedSchema
    description: str
    created_at: int
    created_by: str
    tags: list[str]
    compatibility_mode: CompatibilityMode


@dataclass(frozen=True, slots=True)
class Registered:
    schema_id: int
    version: int
    is_new_version: bool
    fingerprint: str


@dataclass(frozen=True, slots=True)
class SubjectSummary:
    subject: str
    schema_type: str
    latest_version: int
    compatibility_mode: CompatibilityMode
    schema_id: int
    tags: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class TopicBinding:
    """A topic's schema configuration (`/topics/{ns}/{topic}/schema_config`)."""

    subject: str
    schema_id: int
    policy: ValidationPolicy
    payload_validation: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "schema_id": self.schema_id,
            "validation_policy": self.policy.stored,
            "enable_payload_validation": self.payload_validation,
        }

    @classmethod
    def from_json(cls, value: Any) -> TopicBinding:
        try:
            return cls(
                subject=str(value["subject"]),
                schema_id=int(value.get("schema_id", 0)),
                policy=parse_policy(str(value.get("validation_policy", "none"))),
                payload_validation=bool(value.get("enable_payload_validation", False)),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CorruptionError(f"unreadable topic schema config: {exc}") from None


def version_record(
    version: int,
    schema: ParsedSchema,
    *,
    now: int,
    created_by: str,
    description: str,
    tags: list[str],
    descriptor_set: bytes | None,
) -> dict[str, Any]:
    record: dict[str, Any] = {
        "version": version,
        "schema_def": schema.envelope(),
        "fingerprint": schema.fingerprint,
        "created_at": now,
        "created_by": created_by,
        "description": description,
        "tags": tags,
        "is_deprecated": False,
        "deprecation_message": None,
        "schema_type": schema.type.value,  # Ister: the type without unwrapping schema_def
    }
    if descriptor_set is not None:  # Ister: compiled once, read by every broker without protoc
        record["descriptor_set"] = base64.b64encode(descriptor_set).decode()
    return record


def version_summary(record: dict[str, Any]) -> dict[str, Any]:
    """What the subject's metadata keeps of each version (the definition itself stays in its version key,
    so the metadata stays small whatever the schemas' sizes)."""
    return {
        k: record[k]
        for k in (
            "version",
            "fingerprint",
            "created_at",
            "created_by",
            "description",
            "tags",
            "is_deprecated",
        )
        if k in record
    }


def schema_of_record(record: Any) -> ParsedSchema:
    """Rebuild a stored version's schema; CorruptionError when the record cannot be read."""
    try:
        schema_type = parse_schema_type(str(record["schema_type"]))
        definition = record["schema_def"]
        if schema_type.is_primitive:
            return parse(schema_type, "")
        body = definition[schema_type.envelope_tag]
        if schema_type is SchemaType.PROTOBUF:
            compiled = base64.b64decode(record["descriptor_set"])
            return parse(schema_type, str(body["raw_proto"]), compiled)
        return parse(schema_type, str(body["raw_schema"]))
    except Exception as exc:
        raise CorruptionError(f"stored schema version is unreadable: {exc}") from None


def is_protobuf(schema: ParsedSchema) -> bool:
    if schema.type is not SchemaType.PROTOBUF:
        return False  # (only ProtobufSchema has that type; its module loads protobuf's descriptors)
    from ister.core.schema.protobuf import ProtobufSchema

    return isinstance(schema, ProtobufSchema)


def json_rules_of(metadata: Any, default: JsonRules) -> JsonRules:
    """The subject's JSON rules (`json_compatibility`, Ister's own field; absent: the broker's default)."""
    try:
        return parse_json_rules(str(metadata["json_compatibility"]))
    except (KeyError, TypeError, InvalidArgument):
        return default


def mode_of(metadata: Any) -> CompatibilityMode:
    try:
        return parse_mode(str(metadata.get("compatibility_mode", "Backward")))
    except Exception:
        return CompatibilityMode.BACKWARD
