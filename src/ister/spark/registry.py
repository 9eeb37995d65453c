"""Driver side of the connector's schema support: which subject and version type a source's `value`
column, and what a sink registers (or checks) and stamps. One registry round trip per query plan."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql.types import BinaryType, DataType, StringType, StructType

from ister.client.blocking import BlockingClient
from ister.client.schemas import SchemaVersion
from ister.core.schema import SchemaType
from ister.errors import FailedPrecondition, InvalidArgument, NotFound
from ister.spark.derive import avro_definition, json_definition, record_name
from ister.spark.options import SinkOptions, SourceOptions
from ister.spark.typed import Shape, shape_of
from ister.spark.values import ValueSpec


def _topic_subject(client: BlockingClient, topics: tuple[str, ...]) -> str:
    """The subject every named topic is bound to (one, or the option schemaSubject is needed)."""
    subjects: dict[str, str] = {}
    for topic in topics:
        names = [topic, *client.partitions(topic)]
        for name in names:
            try:
                config = client.call(client.client.schemas.topic_config(name))
            except NotFound:
                continue
            if config["schema_subject"]:
                subjects[topic] = str(config["schema_subject"])
                break
        else:
            raise InvalidArgument(
                f"valueFormat=schema: topic {topic} is bound to no schema subject; "
                "set the option schemaSubject"
            )
    found = set(subjects.values())
    if len(found) > 1:
        raise InvalidArgument(
            "valueFormat=schema: the topics are bound to different subjects "
            f"({', '.join(f'{t}: {s}' for t, s in sorted(subjects.items()))}); set the option schemaSubject"
        )
    return found.pop()


def value_spec(opts: SourceOptions) -> tuple[ValueSpec, Shape]:
    """The reader's version (latest or `schemaVersion`) of the subject (`schemaSubject` or the topics')
    and the Spark shape of its values."""
    value = opts.value
    with BlockingClient(
        opts.service_url, connect_timeout=opts.connect_timeout, token=opts.auth.token, tls_ca=opts.auth.tls_ca
    ) as client:
        subject = value.subject or _topic_subject(client, opts.topics)
        resolved: SchemaVersion = client.call(client.client.schemas.resolve(subject, version=value.version))
    shape = shape_of(resolved.schema)
    spec = ValueSpec(
        subject=subject,
        schema_id=resolved.schema_id,
        version=resolved.version,
        schema_type=resolved.schema.type.value,
        definition=resolved.schema.raw,
        fingerprint=resolved.fingerprint,
        mode=value.mode,
        corrupt_column=value.corrupt_column,
    )
    return spec, shape


@dataclass(frozen=True)
class SinkSchema:
    """The version the sink's messages are stamped with, and whether rows are encoded by it (a `value`
    struct) or sent as they are (binary or string values, stamped only)."""

    subject: str
    schema_id: int
    version: int
    schema_type: str
    definition: str
    fingerprint: str
    encode: bool


def sink_schema(opts: SinkOptions, value_type: DataType) -> SinkSchema:
    """Register the DataFrame's `value` struct under the subject (idempotent; the registry refuses an
    incompatible evolution with its reasons), or resolve the pinned / latest version for values that are
    already encoded."""
    assert opts.schema is not None
    want = opts.schema
    encode = isinstance(value_type, StructType)
    if not encode and not isinstance(value_type, BinaryType | StringType):
        raise InvalidArgument(
            f"with schemaSubject the value column is a struct (encoded by the schema) or binary / string "
            f"(sent as it is), got {value_type.simpleString()}"
        )
    with BlockingClient(
        opts.service_url, connect_timeout=opts.connect_timeout, token=opts.auth.token, tls_ca=opts.auth.tls_ca
    ) as client:
        schemas = client.client.schemas
        if not encode or want.version is not None:
            resolved = client.call(schemas.resolve(want.subject, version=want.version))
        else:
            assert isinstance(value_type, StructType)
            resolved = _register(client, opts, value_type)
    if encode and resolved.schema.type not in (SchemaType.AVRO, SchemaType.JSON_SCHEMA):
        raise InvalidArgument(
            f"subject {want.subject} is {resolved.schema.type.value}: the sink encodes avro and json_schema "
            "(write binary values to stamp them only)"
        )
    return SinkSchema(
        subject=want.subject,
        schema_id=resolved.schema_id,
        version=resolved.version,
        schema_type=resolved.schema.type.value,
        definition=resolved.schema.raw,
        fingerprint=resolved.fingerprint,
        encode=encode,
    )


def _register(client: BlockingClient, opts: SinkOptions, value_type: StructType) -> SchemaVersion:
    assert opts.schema is not None
    want = opts.schema
    schemas = client.client.schemas
    kind = want.schema_type
    if kind is None:  # the subject's own type, avro for a new subject
        try:
            kind = client.call(schemas.latest(want.subject)).schema.type.value
        except NotFound:
            kind = SchemaType.AVRO.value
    if kind == SchemaType.AVRO.value:
        definition = avro_definition(value_type, want.record_name or record_name(want.subject))
    elif kind == SchemaType.JSON_SCHEMA.value:
        definition = json_definition(value_type)
    else:
        raise InvalidArgument(
            f"subject {want.subject} is {kind}: the sink registers avro and json_schema (set schemaVersion "
            "to write by an existing version, or schemaType)"
        )
    try:
        registered = client.call(
            schemas.register(want.subject, kind, definition, created_by="ister-spark-sink")
        )
    except FailedPrecondition as exc:
        raise FailedPrecondition(
            f"the DataFrame's schema cannot be registered under {want.subject}: {exc}"
        ) from None
    return client.call(schemas.get(registered.schema_id, registered.version))
