"""A parsed schema: its normalised text, fingerprint and compiled payload validator."""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from ister.core.schema.types import SchemaType
from ister.errors import InvalidArgument

MAX_SCHEMA_BYTES = 256 * 1024  # a definition larger than this is refused (it lives in the metadata store)
MAX_ERRORS = 20  # compatibility errors reported per check (the rest are counted)


def sha256_fingerprint(canonical: str) -> str:
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


class ParsedSchema(ABC):
    """One schema definition, parsed and compiled. Immutable; shared by every topic bound to it."""

    type: SchemaType
    raw: str  # the definition as registered
    canonical: str  # the normalised form the fingerprint is taken of
    fingerprint: str

    @abstractmethod
    def validate(self, payload: bytes) -> str | None:
        """None when the payload is a valid value of this schema, else why not (one line)."""

    def first_invalid(self, payloads: Sequence[bytes], start: int = 0) -> tuple[int, str] | None:
        """(index, reason) of the first payload that is not a valid value, None when all are (the publish
        path validates whole batches through this)."""
        validate = self.validate
        for index in range(start, len(payloads)):
            payload = payloads[index]
            error = validate(payload)
            if error is not None:
                return index, error
        return None

    def decode(self, payload: bytes) -> Any:
        """The payload as a Python value (for consumers that print or convert records)."""
        return payload

    def encode(self, value: Any) -> bytes:
        """A value (as decoded from JSON: dicts, lists, str, numbers) in this schema's encoding;
        InvalidArgument when it is not a value of the schema."""
        data = value if isinstance(value, bytes) else str(value).encode()
        error = self.validate(data)
        if error is not None:
            raise InvalidArgument(error)
        return data

    def envelope(self) -> Any:
        """Danube's `schema_def` JSON: what GetSchema returns as `schema_definition`."""
        return {self.type.envelope_tag: {"raw_schema": self.raw, "fingerprint": self.fingerprint}}

    def __repr__(self) -> str:
        return f"<{self.type.value} schema {self.fingerprint[:19]}>"
