"""The connector's options (Spark hands them over as a case-insensitive dict of strings), checked once on
the driver so a typo fails the query at once with a clear message instead of inside a task."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ister.core.stream_offsets import Spec, TopicPartition, parse_spec
from ister.errors import InvalidArgument
from ister.ids import TopicName, validate_client_name

if TYPE_CHECKING:
    from ister.spark.values import ValueSpec

SERVICE_URL = "ister.service.url"
ADMIN_URL = "ister.admin.url"
STORAGE_URL = "ister.storage.url"
STORAGE_PREFIX = "ister.storage."  # ister.storage.<obstore option>, e.g. ister.storage.endpoint
CONNECT_TIMEOUT = "ister.connect.timeout"
AUTH_TOKEN = "ister.auth.token"  # bearer token (JWT): never logged, never in a plan or a repr
TLS_CA = "ister.tls.ca"  # CA file (PEM, a path readable on the driver and every executor)
# Set by `ister.spark.read` for the part of a batch query it leaves to this source: exact offset ranges
# planned once on the driver (JSON {"/ns/t": {"<partition>": [[start, end), ...]}}), not for users.
RANGES = "ister.internal.ranges"
DEFAULT_CONNECT_TIMEOUT = 10.0  # seconds, the client's default
MAX_CONNECT_TIMEOUT = 600.0

SOURCE_OPTIONS = {
    SERVICE_URL, ADMIN_URL, STORAGE_URL, "topic", "topics", "topicspattern", "startingoffsets",
    "endingoffsets", "minpartitions", "includeheaders", "failondataloss", "maxoffsetspertrigger",
    "valueformat", "readmode", "ister.read.maxrecords", "maxoffsetsperpartition", "predefinedsubscription",
    CONNECT_TIMEOUT, AUTH_TOKEN, TLS_CA, "schemasubject", "schemaversion", "mode",
    "columnnameofcorruptrecord", "ister.read.parquet", "ister.read.parqueturl", RANGES,
    "startingtimestamp", "startingoffsetsbytimestamp",
}  # fmt: skip
VALUE_SCHEMA_OPTIONS = ("schemasubject", "schemaversion", "mode", "columnnameofcorruptrecord")
SINK_OPTIONS = {
    SERVICE_URL, CONNECT_TIMEOUT, "topic", "producername", "dispatchstrategy", "writeidempotencyheader",
    "exactlyonce", "batchmaxmessages", AUTH_TOKEN, TLS_CA, "schemasubject", "schematype", "schemaversion",
    "schemarecordname",
}  # fmt: skip
READ_MODES = ("permissive", "dropmalformed", "failfast")
SINK_SCHEMA_TYPES = {"avro": "avro", "json": "json_schema", "json_schema": "json_schema"}
BATCH_HEADER = "x-ister-spark-batch"


def lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items()}


def _bool(opts: Mapping[str, str], key: str, default: bool) -> bool:
    raw = opts.get(key.lower())
    if raw is None:
        return default
    if raw.strip().lower() in ("true", "1", "yes"):
        return True
    if raw.strip().lower() in ("false", "0", "no"):
        return False
    raise InvalidArgument(f"option {key}: expected true or false, got {raw!r}")


def include_headers(options: Mapping[str, str]) -> bool:
    """The `includeHeaders` option alone (the schema is asked for before the options are checked)."""
    return _bool(lower(options), "includeHeaders", False)


def _positive(opts: Mapping[str, str], key: str) -> int | None:
    raw = opts.get(key.lower())
    if raw is None:
        return None
    if not raw.strip().isdigit() or int(raw) < 1:
        raise InvalidArgument(f"option {key}: expected a positive integer, got {raw!r}")
    return int(raw)


def _host_port(raw: str) -> tuple[str, int] | None:
    """`host:port` (a name, an IPv4 address or a bracketed IPv6 address) or None when it is not one."""
    try:
        parts = urlsplit(f"//{raw}")
        port = parts.port
    except ValueError:
        return None
    host = parts.hostname
    if not host or port is None or port < 1 or parts.path or parts.query or parts.fragment:
        return None
    if not re.fullmatch(r"[A-Za-z0-9._:-]+", host):
        return None
    return host, port


def _service_url(opts: Mapping[str, str]) -> str:
    """Comma-separated brokers, each `http://host:port`, `https://host:port` or a bare `host:port`: checked
    here, so a mistyped URL fails at once instead of after the connect timeout."""
    url = opts.get(SERVICE_URL, "").strip()
    if not url:
        raise InvalidArgument(f"option {SERVICE_URL} is required (e.g. http://127.0.0.1:6650)")
    out = []
    for seed in (u.strip() for u in url.split(",")):
        if not seed:
            continue
        scheme, sep, rest = seed.partition("://")
        if not sep:
            scheme, rest = "http", seed
        if scheme.lower() not in ("http", "https") or _host_port(rest.rstrip("/")) is None:
            raise InvalidArgument(
                f"option {SERVICE_URL}: {seed!r} is not a broker URL (expected http://host:port, "
                "https://host:port or host:port, comma-separated)"
            )
        out.append(f"{scheme.lower()}://{rest.rstrip('/')}")
    if not out:
        raise InvalidArgument(f"option {SERVICE_URL} is required (e.g. http://127.0.0.1:6650)")
    return ",".join(out)  # the client tries each in turn


def _admin_url(opts: Mapping[str, str]) -> str | None:
    raw = opts.get(ADMIN_URL, "").strip()
    if not raw:
        return None
    target = raw.split("://", 1)[1] if raw.lower().startswith(("http://", "grpc://", "https://")) else raw
    if _host_port(target.rstrip("/")) is None:
        raise InvalidArgument(f"option {ADMIN_URL}: expected host:port of the admin API, got {raw!r}")
    # https:// is kept: the admin channel is then TLS (as it is with a token or a CA).
    return ("https://" if raw.lower().startswith("https://") else "") + target.rstrip("/")


def _connect_timeout(opts: Mapping[str, str]) -> float:
    raw = opts.get(CONNECT_TIMEOUT)
    if raw is None:
        return DEFAULT_CONNECT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value <= MAX_CONNECT_TIMEOUT:
        raise InvalidArgument(
            f"option {CONNECT_TIMEOUT}: expected a number of seconds (0 < s <= {MAX_CONNECT_TIMEOUT:g}), "
            f"got {raw!r}"
        )
    return value


@dataclass(frozen=True)
class ClientAuth:
    """`ister.auth.token` and `ister.tls.ca`, handed to every Ister client the connector makes (unset: the
    client's ISTER_TOKEN / ISTER_TLS_CA environment). The token never shows in a repr, so neither in an
    input partition's, an options' nor a log line's."""

    token: str | None = field(default=None, repr=False)
    tls_ca: str | None = None

    def __repr__(self) -> str:
        return f"ClientAuth(token={'***' if self.token else None}, tls_ca={self.tls_ca!r})"

    @classmethod
    def parse(cls, opts: Mapping[str, str]) -> ClientAuth:
        token = opts.get(AUTH_TOKEN, "").strip() or None
        if token is not None and any(c.isspace() for c in token):
            raise InvalidArgument(f"option {AUTH_TOKEN}: a token has no whitespace")  # nor the value
        return cls(token=token, tls_ca=opts.get(TLS_CA, "").strip() or None)


@dataclass(frozen=True)
class ValueOptions:
    """`valueFormat` and, for `schema`, which subject and version type the value column and what happens
    to a record that does not decode (`mode`, Spark's PERMISSIVE / DROPMALFORMED / FAILFAST)."""

    typed: bool = False  # valueFormat=schema
    subject: str | None = None  # schemaSubject; None: the subject the topic is bound to
    version: int | None = None  # schemaVersion; None: the latest when the query is planned
    mode: str = "permissive"
    corrupt_column: str = "_corrupt_record"

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ValueOptions:
        opts = lower(options)
        value_format = opts.get("valueformat", "raw").strip().lower()
        if value_format not in ("raw", "schema"):
            raise InvalidArgument(f"option valueFormat: raw or schema, got {opts['valueformat']!r}")
        if value_format == "raw":
            given = [k for k in VALUE_SCHEMA_OPTIONS if k in opts]
            if given:
                raise InvalidArgument(f"option {given[0]} applies to valueFormat=schema only")
            return cls()
        mode = opts.get("mode", "permissive").strip().lower()
        if mode not in READ_MODES:
            raise InvalidArgument(f"option mode: PERMISSIVE, DROPMALFORMED or FAILFAST, got {opts['mode']!r}")
        corrupt = opts.get("columnnameofcorruptrecord", "_corrupt_record").strip()
        if not corrupt:
            raise InvalidArgument("option columnNameOfCorruptRecord: a column name, got ''")
        return cls(
            typed=True,
            subject=opts.get("schemasubject", "").strip() or None,
            version=_positive(opts, "schemaVersion"),
            mode=mode,
            corrupt_column=corrupt,
        )


@dataclass(frozen=True)
class SinkSchemaOptions:
    """The sink's schema: rows are encoded by `subject` (the DataFrame's schema registered, or a pinned
    `version`), and every message is stamped with its id and version."""

    subject: str
    schema_type: str | None  # avro / json_schema for a new subject; None: the subject's own (avro if new)
    version: int | None
    record_name: str | None

    @classmethod
    def parse(cls, opts: Mapping[str, str]) -> SinkSchemaOptions | None:
        subject = opts.get("schemasubject", "").strip()
        if not subject:
            given = [k for k in ("schematype", "schemaversion", "schemarecordname") if k in opts]
            if given:
                raise InvalidArgument(f"option {given[0]} needs the option schemaSubject")
            return None
        raw_type = opts.get("schematype", "").strip().lower()
        if raw_type and raw_type not in SINK_SCHEMA_TYPES:
            raise InvalidArgument(f"option schemaType: avro or json, got {opts['schematype']!r}")
        record = opts.get("schemarecordname", "").strip() or None
        if record is not None and not re.fullmatch(
            r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", record
        ):
            raise InvalidArgument(f"option schemaRecordName: an Avro name, got {record!r}")
        return cls(subject, SINK_SCHEMA_TYPES.get(raw_type), _positive(opts, "schemaVersion"), record)


SPARK_OWN = {"path", "checkpointlocation"}  # options Spark itself passes through to every source and sink


def _unknown(opts: Mapping[str, str], known: set[str], what: str) -> None:
    for key in opts:
        if key not in known | SPARK_OWN and not key.startswith(STORAGE_PREFIX):
            raise InvalidArgument(f"unknown {what} option {key!r}; known: {', '.join(sorted(known))}")


def _ranges(raw: str | None, streaming: bool | None) -> dict[TopicPartition, list[tuple[int, int]]] | None:
    if raw is None:
        return None
    if streaming:
        raise InvalidArgument(f"option {RANGES} applies to batch queries only")
    try:
        parsed = json.loads(raw)
        out: dict[TopicPartition, list[tuple[int, int]]] = {}
        for topic, parts in parsed.items():
            for part, spans in parts.items():
                tp = TopicPartition(TopicName.parse(topic).full, int(part))
                out[tp] = [(int(a), int(b)) for a, b in spans if 0 <= int(a) <= int(b)]
        return out
    except (ValueError, TypeError, AttributeError) as exc:
        raise InvalidArgument(f"option {RANGES}: not a set of offset ranges ({exc})") from None


@dataclass(frozen=True)
class SourceOptions:
    service_url: str
    topics: tuple[str, ...]  # explicit topics (base names), or () with a pattern
    pattern: re.Pattern[str] | None
    admin_url: str | None
    starting: Spec
    ending: Spec
    min_partitions: int | None
    include_headers: bool
    fail_on_data_loss: bool
    max_offsets_per_trigger: int | None
    storage_url: str | None  # overrides the durable URL the broker reports
    storage_options: dict[str, str] = field(default_factory=dict)
    max_records: int = 10_000
    max_offsets_per_partition: int = 250_000
    cursor_subscription: str | None = None  # predefinedSubscription: a named cursor for lag visibility
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    value: ValueOptions = field(default_factory=ValueOptions)
    value_spec: ValueSpec | None = None  # the reader's version, resolved on the driver (valueFormat=schema)
    auth: ClientAuth = field(default_factory=ClientAuth)
    # Read exported ranges from their Parquet copies when there are any (docs/spark.md, "Parquet copies").
    use_parquet: bool = True
    parquet_url: str | None = None  # the store as Spark's JVM (Hadoop) names it, e.g. s3a://bucket/prefix
    ranges: dict[TopicPartition, list[tuple[int, int]]] | None = None  # RANGES, from `ister.spark.read`
    # As Kafka's source: start at the first message published at or after a time (Unix ms), for every
    # partition (startingTimestamp) or per partition (startingOffsetsByTimestamp); both win over
    # startingOffsets, startingTimestamp over startingOffsetsByTimestamp.
    starting_time: int | None = None
    starting_times: Spec | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str], *, streaming: bool | None) -> SourceOptions:
        """`streaming=None` when it is not known yet (the schema is asked for first): the checks that
        depend on it are left to the reader's own parse."""
        opts = lower(options)
        _unknown(opts, SOURCE_OPTIONS, "source")
        chosen = [k for k in ("topic", "topics", "topicspattern") if opts.get(k, "").strip()]
        if len(chosen) != 1:
            raise InvalidArgument("set exactly one of the options topic, topics, topicsPattern")
        topics: tuple[str, ...] = ()
        pattern = None
        if chosen[0] == "topicspattern":
            try:
                pattern = re.compile(opts["topicspattern"])
            except re.error as exc:
                raise InvalidArgument(f"option topicsPattern: bad regular expression ({exc})") from None
            if not opts.get(ADMIN_URL, "").strip():
                raise InvalidArgument(f"option topicsPattern needs {ADMIN_URL} (topics are listed there)")
        else:
            names = [t.strip() for t in opts[chosen[0]].split(",") if t.strip()]
            topics = tuple(dict.fromkeys(TopicName.parse(t).full for t in names))
        value = ValueOptions.parse(opts)
        if value.typed and value.subject is None and pattern is not None:
            raise InvalidArgument("valueFormat=schema with topicsPattern needs the option schemaSubject")
        if opts.get("readmode", "reader").lower() != "reader":
            raise InvalidArgument("option readMode: only 'reader' (offset ranges, exactly-once) is supported")
        if streaming is False and "maxoffsetspertrigger" in opts:
            raise InvalidArgument("option maxOffsetsPerTrigger applies to streaming queries only")
        if streaming and "endingoffsets" in opts:
            raise InvalidArgument("option endingOffsets applies to batch queries only")
        cursor = opts.get("predefinedsubscription", "").strip() or None
        if cursor is not None:
            if streaming is False:
                raise InvalidArgument("option predefinedSubscription applies to streaming queries only")
            validate_client_name(cursor, "option predefinedSubscription")
        starting = parse_spec(
            opts.get("startingoffsets"), "startingOffsets", default="latest" if streaming else "earliest"
        )
        if streaming is False and starting == "latest":
            raise InvalidArgument("option startingOffsets: 'latest' is not allowed in a batch query")
        ending = parse_spec(
            opts.get("endingoffsets"), "endingOffsets", default="latest", allow_earliest=False
        )
        starting_time = _timestamp(opts.get("startingtimestamp"))
        starting_times: Spec | None = None
        if "startingoffsetsbytimestamp" in opts:
            starting_times = parse_spec(
                opts["startingoffsetsbytimestamp"], "startingOffsetsByTimestamp", default="{}"
            )
            if isinstance(starting_times, str) or any(
                t < 0 for parts in starting_times.values() for t in parts.values()
            ):
                raise InvalidArgument(
                    'option startingOffsetsByTimestamp: a JSON object {"/ns/t": {"0": <Unix ms>, ...}}'
                )
        storage = {k[len(STORAGE_PREFIX) :]: v for k, v in opts.items() if k.startswith(STORAGE_PREFIX)}
        storage.pop("url", None)
        return cls(
            service_url=_service_url(opts),
            topics=topics,
            pattern=pattern,
            admin_url=_admin_url(opts),
            starting=starting,
            ending=ending,
            min_partitions=_positive(opts, "minPartitions"),
            starting_time=starting_time,
            starting_times=starting_times,
            include_headers=include_headers(opts),
            fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
            max_offsets_per_trigger=_positive(opts, "maxOffsetsPerTrigger"),
            storage_url=opts.get(STORAGE_URL) or None,
            storage_options=storage,
            max_records=_positive(opts, "ister.read.maxRecords") or 10_000,
            max_offsets_per_partition=_positive(opts, "maxOffsetsPerPartition") or 250_000,
            cursor_subscription=cursor,
            connect_timeout=_connect_timeout(opts),
            value=value,
            auth=ClientAuth.parse(opts),
            use_parquet=_bool(opts, "ister.read.parquet", True),
            parquet_url=opts.get("ister.read.parqueturl", "").strip().rstrip("/") or None,
            ranges=_ranges(opts.get(RANGES), streaming),
        )


@dataclass(frozen=True)
class SinkOptions:
    service_url: str
    topic: str | None
    producer_name: str | None
    reliable: bool
    idempotency_header: bool
    exactly_once: bool = True  # deterministic producer keys and batches (ister.spark.once)
    batch_max_messages: int = 4096  # messages per publish batch (the broker's limit may be lower)
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    schema: SinkSchemaOptions | None = None
    auth: ClientAuth = field(default_factory=ClientAuth)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        opts = lower(options)
        _unknown(opts, SINK_OPTIONS, "sink")
        topic = opts.get("topic", "").strip() or None
        strategy = opts.get("dispatchstrategy", "reliable").lower()
        if strategy not in ("reliable", "non_reliable"):
            raise InvalidArgument(f"option dispatchStrategy: reliable or non_reliable, got {strategy!r}")
        reliable = strategy == "reliable"
        exactly_once = _bool(opts, "exactlyOnce", reliable)
        if exactly_once and not reliable:
            raise InvalidArgument(
                "option exactlyOnce needs dispatchStrategy reliable (a non-reliable topic stores nothing a "
                "retry could be recognised by)"
            )
        return cls(
            service_url=_service_url(opts),
            topic=TopicName.parse(topic).full if topic else None,
            producer_name=opts.get("producername") or None,
            reliable=reliable,
            idempotency_header=_bool(opts, "writeIdempotencyHeader", True),
            exactly_once=exactly_once,
            batch_max_messages=_positive(opts, "batchMaxMessages") or 4096,
            connect_timeout=_connect_timeout(opts),
            schema=SinkSchemaOptions.parse(opts),
            auth=ClientAuth.parse(opts),
        )


def _timestamp(raw: str | None) -> int | None:
    """startingTimestamp: Unix milliseconds (as Kafka's source), None when not given."""
    if raw is None:
        return None
    text = raw.strip()
    if not text.isdigit():
        raise InvalidArgument(f"option startingTimestamp: Unix milliseconds, got {raw!r}")
    return int(text)
