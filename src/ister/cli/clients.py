"""`ister produce` and `ister consume`: danube-cli's flags, on Ister's batch-API client."""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
import uvloop

from ister.cli.main import app
from ister.cli.security_opts import TlsCaOpt, TokenOpt, use
from ister.client import Client, Consumer, Message
from ister.core.backoff import Backoff, Retries
from ister.errors import InvalidArgument, IsterError, NotFound
from ister.ids import counted

if TYPE_CHECKING:
    from rich.progress import Progress

SUB_TYPES = {
    "exclusive": "exclusive",
    "shared": "shared",
    "fail-over": "failover",
    "partitioned": "partitioned",
    "key-shared": "key_shared",
}
PROGRESS_FROM = 1_000  # show a progress bar for runs at least this long (and never with --json)
WAIT_FOR_TOPIC_FIRST_POLL = 0.2  # `ister consume` on a topic not created yet: look again after this, ...
WAIT_FOR_TOPIC_MAX_POLL = 2.0  # ... doubling up to this
WAIT_FOR_TOPIC_POLLS = Backoff(first=WAIT_FOR_TOPIC_FIRST_POLL, cap=WAIT_FOR_TOPIC_MAX_POLL)


def parse_attributes(raw: str | None) -> dict[str, str]:
    """`k1:v1,k2:v2` as danube-cli takes them."""
    out: dict[str, str] = {}
    if not raw:
        return out
    for item in raw.split(","):
        key, sep, value = item.partition(":")
        if not sep or not key:
            raise InvalidArgument(f"attribute {item!r} is not KEY:VALUE")
        out[key.strip()] = value.strip()
    return out


def _progress(total: int) -> Progress:
    # rich is imported here: it costs ~0.15 s of CPU at every `ister` start (a broker's too).
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeRemainingColumn(),
        console=None,
        transient=False,
        disable=not sys.stderr.isatty(),
    )


def _fail(exc: BaseException) -> typer.Exit:
    typer.echo(f"error: {exc}", err=True)
    return typer.Exit(1)


SERVICE_ADDR_ENV = "ISTER_SERVICE_ADDR"  # what `ister dev env` exports


@app.command()
def produce(
    service_addr: Annotated[
        str,
        typer.Option(
            "--service-addr", "-s", envvar=SERVICE_ADDR_ENV, help="broker URL, e.g. http://127.0.0.1:6650"
        ),
    ],
    topic: Annotated[str, typer.Option("--topic", "-t")] = "/default/test_topic",
    producer_name: Annotated[str, typer.Option("--producer-name", "-n")] = "test_producer",
    message: Annotated[str | None, typer.Option("--message", "-m", help="UTF-8 payload")] = None,
    file: Annotated[
        Path | None, typer.Option("--file", "-f", help="binary payload file (wins over -m)")
    ] = None,
    attributes: Annotated[str | None, typer.Option("--attributes", "-a", help="k1:v1,k2:v2")] = None,
    partitions: Annotated[int | None, typer.Option("--partitions", "-p", min=1)] = None,
    count: Annotated[int, typer.Option("--count", "-c", min=1)] = 1,
    reliable: Annotated[
        bool,
        typer.Option(
            "--reliable/--non-reliable",
            help="Reliable (the default: WAL, idempotent, as the Ister client) or NonReliable "
            "(in memory, at-most-once: a subscription that is away loses what is sent meanwhile)",
        ),
    ] = True,
    rate: Annotated[
        float, typer.Option("--rate", min=0.0, help="messages per second (0: as fast as possible)")
    ] = 0.0,
    key: Annotated[str | None, typer.Option("--key", "-k", help="routing key")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per message on stdout")] = False,
    schema_subject: Annotated[
        str | None,
        typer.Option(
            "--schema-subject", help="stamp messages with this subject's latest version; -m is JSON"
        ),
    ] = None,
    schema_file: Annotated[
        Path | None,
        typer.Option("--schema-file", help="register this .avsc/.json/.proto first (subject: topic-derived)"),
    ] = None,
    schema_type: Annotated[
        str | None, typer.Option("--schema-type", help="avro|json_schema|protobuf (default: by suffix)")
    ] = None,
    compression: Annotated[
        str,
        typer.Option("--compression", help="none|lz4|zstd|snappy|gzip: sent and stored compressed"),
    ] = "none",
    token: TokenOpt = None,
    tls_ca: TlsCaOpt = None,
) -> None:
    """Publish COUNT messages (danube-cli's flags); every message is acknowledged before the command ends.

    Reliable by default (fsync'd to the topic's WAL before it is acknowledged); --non-reliable publishes
    at-most-once (danube-cli's default).

    Idempotent on a Reliable topic: a batch re-sent after a lost acknowledgement is stored once.

    With --schema-subject or --schema-file, -m is a JSON value encoded by the schema (Avro binary, JSON,
    Protobuf) and checked against it before anything is sent; -f is sent as it is."""
    use(token, tls_ca)
    try:
        if file is not None:
            payload = file.read_bytes()
        elif message is not None:
            payload = message.encode()
        else:
            raise InvalidArgument("give a payload with --message or --file")
        attrs = parse_attributes(attributes)
        schema = None
        if schema_file is not None or schema_subject is not None:
            schema = SchemaSpec(
                subject=schema_subject or topic.strip("/").replace("/", "-"),
                file=schema_file,
                schema_type=schema_type,
                raw_payload=file is not None,
            )
    except (OSError, IsterError) as exc:
        raise _fail(exc) from None
    try:
        uvloop.run(
            _produce(
                service_addr,
                topic,
                producer_name,
                payload,
                attrs,
                partitions,
                count,
                reliable,
                rate,
                key,
                as_json,
                schema,
                compression,
            )
        )
    except (IsterError, OSError) as exc:
        raise _fail(exc) from None


@dataclass(frozen=True)
class SchemaSpec:
    subject: str
    file: Path | None
    schema_type: str | None
    raw_payload: bool


async def _with_schema(client: Client, spec: SchemaSpec, payload: bytes) -> bytes:
    """Register the schema file if given; the payload encoded (or, raw, checked) by the subject's latest."""
    if spec.file is not None:
        from ister.cli.schemas import TYPES_BY_SUFFIX

        kind = spec.schema_type or TYPES_BY_SUFFIX.get(spec.file.suffix.lower())
        if kind is None:
            raise InvalidArgument(f"cannot tell the schema type of {spec.file.name}: pass --schema-type")
        done = await client.schemas.register(
            spec.subject, kind, spec.file.read_bytes(), created_by="ister-cli"
        )
        typer.echo(f"schema {spec.subject} version {done.version} (id {done.schema_id})", err=True)
    latest = await client.schemas.latest(spec.subject)
    if spec.raw_payload or latest.schema.type.is_primitive:
        error = latest.schema.validate(payload)
        if error is not None:
            raise InvalidArgument(f"the payload does not match {spec.subject}: {error}")
        return payload
    try:
        value = json.loads(payload)
    except ValueError as exc:
        raise InvalidArgument(f"with a schema, --message is a JSON value: {exc}") from None
    return latest.schema.encode(value)


async def _produce(
    url: str,
    topic: str,
    name: str,
    payload: bytes,
    attrs: dict[str, str],
    partitions: int | None,
    count: int,
    reliable: bool,
    rate: float,
    key: str | None,
    as_json: bool,
    schema: SchemaSpec | None = None,
    compression: str = "none",
) -> None:
    async with Client(url, wait_for_broker=False) as client:
        if schema is not None:
            payload = await _with_schema(client, schema, payload)
        producer = await client.producer(
            topic,
            name,
            reliable=reliable,
            partitions=partitions,
            schema_subject=schema.subject if schema is not None else None,
            compression=compression,
        )
        pending: list[asyncio.Future[int]] = []
        started = time.perf_counter()
        show = not as_json and count >= PROGRESS_FROM
        with _progress(count) as bar:
            task = bar.add_task("produce", total=count, rate="", visible=show)
            for i in range(count):
                if rate:
                    delay = started + i / rate - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                pending.append(producer.send_nowait(payload, attributes=attrs or None, key=key))
                if len(pending) >= 4096 or i == count - 1:
                    offsets = await asyncio.gather(*pending)
                    pending.clear()
                    if as_json:
                        for offset in offsets:
                            print(json.dumps({"offset": offset, "topic": topic}))
                    done = i + 1
                    elapsed = time.perf_counter() - started
                    bar.update(task, completed=done, rate=f"{done / elapsed:,.0f} msg/s" if elapsed else "")
        await producer.close()
        if not as_json:
            elapsed = time.perf_counter() - started
            typer.echo(f"produced {counted(count, 'message')} to {topic} in {elapsed:.2f} s", err=True)


def message_json(msg: Message, value: object = None) -> str:
    payload = msg.payload
    obj: dict[str, object] = {"offset": msg.offset, "topic": msg.topic}
    if msg.schema_id is not None:
        obj["schema_id"] = str(msg.schema_id)  # a u64 id: a string, as in every JSON output
        obj["schema_version"] = msg.schema_version
        obj["value"] = value
    try:
        obj["payload"] = payload.decode()
    except UnicodeDecodeError:
        obj["payload"] = base64.b64encode(payload).decode()
        obj["payload_encoding"] = "base64"
    obj["attributes"] = msg.attributes
    obj["publish_time"] = msg.publish_time
    if msg.key is not None:
        obj["key"] = msg.key
    return json.dumps(obj, default=_jsonable)


def _jsonable(value: object) -> object:
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode()
    return str(value)


async def _decoded(client: Client, msg: Message) -> object:
    """The payload decoded by its stamped schema version; None without one (or when it does not decode)."""
    if msg.schema_id is None:
        return None
    try:
        return await client.schemas.decode(msg)
    except Exception as exc:  # a payload stored under warn, or a version deleted since
        return {"undecodable": str(exc)}


@app.command()
def consume(
    service_addr: Annotated[
        str, typer.Option("--service-addr", "-s", envvar=SERVICE_ADDR_ENV, help="broker URL")
    ],
    subscription: Annotated[str, typer.Option("--subscription", "-m")],
    topic: Annotated[str, typer.Option("--topic", "-t")] = "/default/test_topic",
    consumer_name: Annotated[str, typer.Option("--consumer", "-n")] = "consumer_pubsub",
    sub_type: Annotated[
        str, typer.Option("--sub-type", help="exclusive|shared|fail-over|key-shared")
    ] = "shared",
    count: Annotated[
        int | None, typer.Option("--count", "-c", min=1, help="exit after this many messages")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per message on stdout")] = False,
    position: Annotated[
        str | None,
        typer.Option(
            "--position",
            help="where a new subscription starts: latest (default, as Danube) or earliest; an existing "
            "subscription keeps its cursor",
        ),
    ] = None,
    from_beginning: Annotated[
        bool, typer.Option("--from-beginning", help="the same as --position earliest (Kafka's spelling)")
    ] = False,
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout",
            min=0.0,
            help="seconds to wait for the topic to be created (default: until it is; 0: fail at once)",
        ),
    ] = None,
    token: TokenOpt = None,
    tls_ca: TlsCaOpt = None,
) -> None:
    """Receive and acknowledge messages until --count (or Ctrl-C); waits for a topic not created yet. A new
    subscription starts at the latest message unless --position earliest (or --from-beginning)."""
    use(token, tls_ca)
    if sub_type not in SUB_TYPES:
        raise _fail(InvalidArgument(f"--sub-type must be one of {', '.join(SUB_TYPES)}"))
    if position not in (None, "latest", "earliest"):
        raise _fail(InvalidArgument(f"--position must be latest or earliest, not {position!r}"))
    if from_beginning and position == "latest":
        raise _fail(InvalidArgument("--from-beginning contradicts --position latest"))
    start = position or ("earliest" if from_beginning else "latest")
    try:
        uvloop.run(
            _consume(
                service_addr,
                topic,
                subscription,
                consumer_name,
                SUB_TYPES[sub_type],
                count,
                as_json,
                timeout,
                start,
            )
        )
    except KeyboardInterrupt:
        raise typer.Exit(0) from None
    except (IsterError, OSError) as exc:
        raise _fail(exc) from None


async def _subscribe(
    client: Client,
    topic: str,
    subscription: str,
    name: str,
    sub_type: str,
    wait_seconds: float | None,
    position: str = "latest",
) -> Consumer:
    """Subscribe, waiting (with a message on stderr) while the topic does not exist, up to `wait_seconds`."""
    deadline = None if wait_seconds is None else time.monotonic() + wait_seconds
    polls = Retries(WAIT_FOR_TOPIC_POLLS)
    waiting = False
    while True:
        try:
            # A lookup first: it says "no such topic" quietly (a failed subscribe logs a warning).
            if await client.lookup_with_retry(topic) is not None:
                consumer = await client.consumer(
                    topic, subscription, type=sub_type, name=name, initial_position=position
                )
                break
            missing: NotFound = NotFound(f"topic {topic} does not exist")
        except NotFound as exc:  # deleted between the lookup and the subscribe
            missing = exc
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            if waiting:
                raise NotFound(f"{missing} (waited {wait_seconds:g} s for it to be created)")
            raise missing
        if not waiting:
            limit = "" if wait_seconds is None else f" for up to {wait_seconds:g} s"
            typer.echo(
                f"topic {topic} does not exist yet: waiting{limit} for it to be created (Ctrl-C to stop)",
                err=True,
            )
            waiting = True
        delay = polls.next()
        await asyncio.sleep(delay if left is None else min(delay, left))
    if waiting:
        typer.echo(f"topic {topic} exists now: consuming", err=True)
    return consumer


async def _consume(
    url: str,
    topic: str,
    subscription: str,
    name: str,
    sub_type: str,
    count: int | None,
    as_json: bool,
    wait_seconds: float | None = None,
    position: str = "latest",
) -> None:
    async with Client(url, wait_for_broker=False) as client:
        consumer = await _subscribe(client, topic, subscription, name, sub_type, wait_seconds, position)
        received = 0
        started = time.perf_counter()
        show = not as_json and count is not None and count >= PROGRESS_FROM
        with _progress(count or 0) as bar:
            task = bar.add_task("consume", total=count, rate="", visible=show)
            async for msg in consumer:
                value = await _decoded(client, msg)
                if as_json:
                    print(message_json(msg, value), flush=count is None)
                elif not show and msg.schema_id is not None:
                    shown_value = json.dumps(value, default=_jsonable)
                    typer.echo(
                        f"offset={msg.offset} topic={msg.topic} schema={msg.schema_id}/v{msg.schema_version} "
                        f"value={shown_value}"
                    )
                elif not show:
                    text = msg.payload.decode(errors="replace")
                    typer.echo(
                        f"offset={msg.offset} topic={msg.topic} bytes={len(msg.payload)} payload={text}"
                    )
                msg.ack_nowait()
                received += 1
                if show and received % 1000 == 0:
                    elapsed = time.perf_counter() - started
                    bar.update(task, completed=received, rate=f"{received / elapsed:,.0f} msg/s")
                if count is not None and received >= count:
                    break
        await consumer.close()
