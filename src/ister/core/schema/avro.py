"""Avro: fastavro compiles the schema and reads payloads; Apache Avro's reader/writer check decides
compatibility (the specification's schema resolution: defaults, promotions, unions, aliases, enums).

A payload is one datum in Avro binary encoding (no header), or an Avro object container file (it starts
with `Obj\\x01`), whose records are then read with the registered schema as the reader's schema.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from typing import Any

import avro.compatibility as avro_compat
import avro.errors
import avro.schema
import fastavro
import fastavro.schema
from fastavro._read_common import SchemaResolutionError

from ister.core.schema.avro_check import compile_check
from ister.core.schema.model import ParsedSchema, sha256_fingerprint
from ister.core.schema.types import SchemaType
from ister.errors import InvalidArgument
from ister.ids import clip

CONTAINER_MAGIC = b"Obj\x01"
STRICT_REFUSAL = (
    "not a datum of the Avro schema: it breaks the binary encoding (a varint over 10 bytes, an int beyond "
    "32 bits, a boolean byte other than 0 or 1, or an enum index out of range)"
)
_CHECKER = avro_compat.ReaderWriterCompatibilityChecker


class AvroSchema(ParsedSchema):
    def __init__(self, raw: str) -> None:
        self.type = SchemaType.AVRO
        self.raw = raw
        try:
            document = json.loads(raw)
        except ValueError as exc:
            raise InvalidArgument(f"Avro schema is not JSON: {clip(str(exc))}") from None
        try:
            self._parsed: Any = fastavro.schema.parse_schema(document, _write_hint=False)
            self.resolvable = avro.schema.parse(raw)
        except (fastavro.schema.SchemaParseException, fastavro.schema.UnknownType) as exc:
            raise InvalidArgument(f"invalid Avro schema: {clip(str(exc))}") from None
        except (avro.errors.AvroException, ValueError, TypeError, KeyError, AttributeError) as exc:
            raise InvalidArgument(f"invalid Avro schema: {clip(str(exc))}") from None
        except RecursionError:
            raise InvalidArgument("invalid Avro schema: nested too deeply") from None
        # Normalised: the library's JSON of the parsed schema (full names, no whitespace, sorted keys);
        # unlike the Parsing Canonical Form it keeps defaults, aliases and docs, which change meaning.
        self.canonical = json.dumps(self.resolvable.to_json(), sort_keys=True, separators=(",", ":"))
        self.fingerprint = sha256_fingerprint(self.canonical)
        self._reader = fastavro.schemaless_reader
        self._check = compile_check(self.resolvable)  # None with logical types: fastavro decodes

    def validate(self, payload: bytes) -> str | None:
        check = self._check
        if check is not None and check(payload):
            return None
        return self._refusal(payload)

    def _refusal(self, payload: bytes) -> str | None:
        """Why a payload the compiled check refused is not valid (fastavro's reason), or None for an
        object container file whose records resolve."""
        try:
            self.decode(payload)
        except _DecodeFailed as exc:
            return str(exc)
        if self._check is None or payload.startswith(CONTAINER_MAGIC):
            return None
        return STRICT_REFUSAL

    def first_invalid(self, payloads: Sequence[bytes], start: int = 0) -> tuple[int, str] | None:
        check = self._check
        if check is not None:  # the publish path's loop: the compiled check, fastavro for the reason
            for index in range(start, len(payloads)):
                payload = payloads[index]
                if not check(payload):
                    error = self._refusal(payload)
                    if error is not None:
                        return index, error
            return None
        # The per-datum loop of `decode` with its lookups hoisted.
        reader, parsed, new_stream = self._reader, self._parsed, io.BytesIO
        for index in range(start, len(payloads)):
            payload = payloads[index]
            if payload[:4] == CONTAINER_MAGIC:
                error = self.validate(payload)
            else:
                stream = new_stream(payload)
                try:
                    reader(stream, parsed, None)
                except Exception:
                    error = self.validate(payload)  # again, for the reason
                else:
                    error = None if stream.tell() == len(payload) else self.validate(payload)
            if error is not None:
                return index, error
        return None

    def encode(self, value: Any) -> bytes:
        out = io.BytesIO()
        try:
            fastavro.schemaless_writer(out, self._parsed, value)
        except Exception as exc:  # fastavro's ValueError / TypeError / KeyError for a value off the schema
            raise InvalidArgument(f"not a value of the Avro schema: {clip(str(exc))}") from None
        return out.getvalue()

    def decode(self, payload: bytes) -> Any:
        if payload.startswith(CONTAINER_MAGIC):
            return self._decode_container(payload)
        stream = io.BytesIO(payload)
        try:
            value = self._reader(stream, self._parsed, None, return_record_name=False)
        except (EOFError, StopIteration):
            raise _DecodeFailed("Avro payload ends before the datum does") from None
        except Exception as exc:  # fastavro raises ValueError, IndexError, UnicodeDecodeError, …
            raise _DecodeFailed(f"not a datum of the Avro schema: {clip(str(exc))}") from None
        if stream.tell() != len(payload):
            raise _DecodeFailed(f"{len(payload) - stream.tell()} bytes left over after the Avro datum")
        return value

    def read_as(self, payload: bytes, reader: AvroSchema) -> Any:
        """One datum written with this schema, resolved into `reader`'s by Avro schema resolution (fields
        the reader adds take their defaults, fields it lacks are skipped, promotions apply); ValueError
        naming why it cannot be read."""
        if reader.fingerprint == self.fingerprint:
            return self.decode(payload)
        stream = io.BytesIO(payload)
        try:
            value = self._reader(stream, self._parsed, reader._parsed, return_record_name=False)
        except SchemaResolutionError as exc:
            raise _DecodeFailed(f"the writer's schema does not resolve: {clip(str(exc))}") from None
        except (EOFError, StopIteration):
            raise _DecodeFailed("Avro payload ends before the datum does") from None
        except Exception as exc:
            raise _DecodeFailed(f"not a datum of the Avro schema: {clip(str(exc))}") from None
        if stream.tell() != len(payload):
            raise _DecodeFailed(f"{len(payload) - stream.tell()} bytes left over after the Avro datum")
        return value

    def _decode_container(self, payload: bytes) -> list[Any]:
        try:
            return list(fastavro.reader(io.BytesIO(payload), reader_schema=self._parsed))
        except SchemaResolutionError as exc:
            raise _DecodeFailed(f"the container's schema does not resolve: {clip(str(exc))}") from None
        except Exception as exc:
            raise _DecodeFailed(f"not an Avro container of the schema: {clip(str(exc))}") from None


class _DecodeFailed(ValueError):
    pass


def avro_can_read(reader: AvroSchema, writer: AvroSchema) -> list[str]:
    """Why data written with `writer` cannot be read with `reader` (empty: it can)."""
    result = _CHECKER().get_compatibility(  # type: ignore[no-untyped-call]
        reader.resolvable, writer.resolvable
    )
    if result.compatibility is avro_compat.SchemaCompatibilityType.compatible:
        return []
    out = []
    locations = sorted(result.locations) or ["/"]
    for kind, message in zip(result.incompatibilities, sorted(result.messages), strict=False):
        out.append(f"{kind.value} at {locations[0]}: {message}")
    return out or ["the reader's schema cannot resolve the writer's"]
