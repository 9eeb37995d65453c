"""The schemaless types: bytes (anything), string (UTF-8) and number (4 or 8 bytes, as Danube)."""

from __future__ import annotations

from typing import Any

from ister.core.schema.model import ParsedSchema
from ister.core.schema.types import SchemaType


class PrimitiveSchema(ParsedSchema):
    def __init__(self, schema_type: SchemaType) -> None:
        self.type = schema_type
        self.raw = ""
        self.canonical = schema_type.value
        self.fingerprint = schema_type.value  # Danube's literal fingerprints: `bytes`, `string`, `number`

    def validate(self, payload: bytes) -> str | None:
        if self.type is SchemaType.STRING:
            try:
                payload.decode()
            except UnicodeDecodeError as exc:
                return f"payload is not UTF-8 text ({exc.reason} at byte {exc.start})"
        elif self.type is SchemaType.NUMBER and len(payload) not in (4, 8):
            return f"a number payload is 4 or 8 bytes, not {len(payload)}"
        return None

    def decode(self, payload: bytes) -> Any:
        if self.type is SchemaType.STRING:
            return payload.decode(errors="replace")
        return payload

    def encode(self, value: Any) -> bytes:
        if self.type is SchemaType.NUMBER and isinstance(value, int | float) and not isinstance(value, bool):
            import struct

            return struct.pack(">q", value) if isinstance(value, int) else struct.pack(">d", value)
        return super().encode(value)

    def envelope(self) -> Any:
        return self.type.envelope_tag
