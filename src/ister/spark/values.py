"""`valueFormat=schema` in the source's tasks: payloads → typed values by the registry's schemas.

The reader's schema (the subject's latest version when the query was planned, or `schemaVersion`) gives
the `value` column its type. Each record is decoded by the version it is stamped with: Avro records of
another version are resolved into the reader's schema (defaults, promotions, skipped fields); JSON records
are conformed to the reader's type; Protobuf records are read with the reader's message (unknown field
numbers skipped, missing ones default), as Protobuf itself resolves versions. A record that cannot be
decoded (no schema id, another subject's id, bytes that are not a value, a value that does not fit the
reader's type) is handled by `mode`: PERMISSIVE (null value, the raw payload in the corrupt-record
column), DROPMALFORMED (the row is dropped) or FAILFAST (the query fails naming topic, offset and reason).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
from pyspark.sql.pandas.types import to_arrow_type

from ister.core.schema import (
    AvroSchema,
    JsonSchema,
    ParsedSchema,
    ProtobufSchema,
    SchemaType,
    parse,
    parse_schema_type,
)
from ister.errors import InvalidArgument, IsterError, NotFound
from ister.spark.options import ClientAuth
from ister.spark.typed import Shape, Unreadable, shape_of

PERMISSIVE, DROPMALFORMED, FAILFAST = "permissive", "dropmalformed", "failfast"
MODES = (PERMISSIVE, DROPMALFORMED, FAILFAST)
DEFAULT_CORRUPT_COLUMN = "_corrupt_record"
_ARROW_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError, TypeError)


@dataclass(frozen=True)
class ValueSpec:
    """The reader's schema version and the mode, resolved on the driver and shipped to every task."""

    subject: str
    schema_id: int
    version: int
    schema_type: str
    definition: str  # as registered
    fingerprint: str
    mode: str = PERMISSIVE
    corrupt_column: str = DEFAULT_CORRUPT_COLUMN


def parse_definition(schema_type: str, definition: str) -> ParsedSchema:
    kind = parse_schema_type(schema_type)
    if kind is SchemaType.PROTOBUF:
        from ister.schema.protoc import compile_proto_sync

        return parse(kind, definition, compile_proto_sync(definition))
    return parse(kind, definition)


_parsed: dict[tuple[str, str], ParsedSchema] = {}  # per worker process: (type, fingerprint) → schema
_lock = threading.Lock()


def parsed(schema_type: str, definition: str, fingerprint: str) -> ParsedSchema:
    key = (schema_type, fingerprint)
    with _lock:
        found = _parsed.get(key)
    if found is None:
        found = parse_definition(schema_type, definition)
        with _lock:
            if len(_parsed) > 256:
                _parsed.clear()
            _parsed[key] = found
    return found


Fetch = Callable[[int, int], ParsedSchema]  # (schema id, version) → that version's schema


class ValueDecoder:
    """Decodes the `value` column of the source's raw batches (one per task, writer versions cached)."""

    def __init__(self, spec: ValueSpec, fetch: Fetch) -> None:
        self.spec = spec
        self.reader = parsed(spec.schema_type, spec.definition, spec.fingerprint)
        self.shape: Shape = shape_of(self.reader)
        self.arrow_type = to_arrow_type(self.shape.dtype, timezone="UTC")
        self.fetch = fetch
        self.writers: dict[int, ParsedSchema | str] = {}  # version → schema, or why it is unavailable

    def writer(self, version: int) -> ParsedSchema:
        found = self.writers.get(version)
        if found is None:
            try:
                found = self.fetch(self.spec.schema_id, version)
            except NotFound:
                found = f"subject {self.spec.subject} has no version {version}"
            self.writers[version] = found
        if isinstance(found, str):
            raise Unreadable(found)
        return found

    def value(self, payload: bytes, schema_id: int | None, version: int | None) -> Any:
        """The payload as the reader's value (what Arrow takes); Unreadable naming why not."""
        if schema_id is None:
            raise Unreadable("the message carries no schema id")
        if schema_id != self.spec.schema_id:
            raise Unreadable(
                f"written with schema id {schema_id}, "
                f"not subject {self.spec.subject}'s ({self.spec.schema_id})"
            )
        reader = self.reader
        try:
            if isinstance(reader, AvroSchema):
                writer = reader if version in (None, self.spec.version) else self.writer(version)
                if not isinstance(writer, AvroSchema):
                    raise Unreadable(f"version {version} of {self.spec.subject} is not an Avro schema")
                decoded = writer.read_as(payload, reader)
            elif isinstance(reader, JsonSchema):
                decoded = reader.decode(payload)
            elif isinstance(reader, ProtobufSchema):
                decoded = reader.message_class.FromString(payload)
            else:  # shape_of refused it on the driver
                raise Unreadable(f"{reader.type.value} values have no Spark type")
        except Unreadable:
            raise
        except (ValueError, DecodeError) as exc:  # msgspec's DecodeError is a ValueError
            raise Unreadable(str(exc) or type(exc).__name__) from None
        conv = self.shape.conv
        return decoded if conv is None else conv(decoded)

    def decode(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The raw batch with `value` decoded and the corrupt-record column added (rows dropped under
        DROPMALFORMED); FAILFAST raises at the first record that does not decode."""
        names = batch.schema.names
        payloads = batch.column(names.index("value")).to_pylist()
        ids = batch.column(names.index("schemaId")).to_pylist()
        versions = batch.column(names.index("schemaVersion")).to_pylist()
        values: list[Any] = []
        corrupt: list[bytes | None] = []
        for i, payload in enumerate(payloads):
            try:
                values.append(self.value(payload, ids[i], versions[i]))
                corrupt.append(None)
            except Unreadable as exc:
                self.failed(batch, i, str(exc))
                values.append(None)
                corrupt.append(payload)
        column = self.arrow(values, corrupt, payloads, batch)
        columns = [column if n == "value" else batch.column(j) for j, n in enumerate(names)]
        columns.append(pa.array(corrupt, pa.binary()))
        fields = [pa.field(n, column.type) if n == "value" else batch.schema.field(n) for n in names]
        fields.append(pa.field(self.spec.corrupt_column, pa.binary()))
        out = pa.RecordBatch.from_arrays(columns, schema=pa.schema(fields))
        if self.spec.mode == DROPMALFORMED and any(c is not None for c in corrupt):
            out = out.filter(pa.array([c is None for c in corrupt]))
        return out

    def arrow(
        self, values: list[Any], corrupt: list[bytes | None], payloads: list[Any], batch: pa.RecordBatch
    ) -> pa.Array:
        """The decoded values as one Arrow array; a value Arrow refuses (out of range, …) is a corrupt
        record like any other."""
        try:
            return pa.array(values, self.arrow_type)
        except _ARROW_ERRORS:
            pass
        for i, value in enumerate(values):
            if value is None:
                continue
            try:
                pa.array([value], self.arrow_type)
            except _ARROW_ERRORS as exc:
                self.failed(batch, i, f"the value does not fit the reader's type: {exc}")
                values[i], corrupt[i] = None, payloads[i]
        return pa.array(values, self.arrow_type)

    def failed(self, batch: pa.RecordBatch, row: int, reason: str) -> None:
        if self.spec.mode != FAILFAST:
            return
        names = batch.schema.names
        topic = batch.column(names.index("topic"))[row].as_py()
        offset = batch.column(names.index("offset"))[row].as_py()
        raise InvalidArgument(
            f"{topic} offset {offset}: the value does not decode by subject {self.spec.subject} "
            f"(reader version {self.spec.version}): {reason} (mode FAILFAST; PERMISSIVE keeps the record "
            f"in {self.spec.corrupt_column}, DROPMALFORMED drops it)"
        )


def fetcher(service_url: str, connect_timeout: float, auth: ClientAuth | None = None) -> Fetch:
    """Versions from the registry through the worker's shared client (cached by the client)."""

    def fetch(schema_id: int, version: int) -> ParsedSchema:
        from ister.spark.shared import shared_client

        client = shared_client(service_url, connect_timeout, auth)
        try:
            return client.call(client.client.schemas.get(schema_id, version)).schema
        except NotFound:
            raise
        except IsterError as exc:
            raise InvalidArgument(f"cannot fetch version {version} of schema id {schema_id}: {exc}") from None

    return fetch
