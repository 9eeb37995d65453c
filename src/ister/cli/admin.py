"""`ister admin ...`: topics, namespaces and brokers through the admin gRPC API (package `danube_admin`).

Command names follow danube-admin (docs/admin.md). Every command takes `--admin-addr HOST:PORT` (env
`ISTER_ADMIN_ADDR`, default 127.0.0.1:50051) and `--output table|json`. Failures print `error: <message>` and
exit 1; usage errors exit 2. Documented in docs/admin.md.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, NoReturn, TypeVar

import grpc
import typer

from ister.cli.main import app
from ister.cli.security_opts import ApiKeyOpt, TlsCaOpt, TokenOpt, api_key, current, use
from ister.client.transport import TOKEN_ENV, Credentials
from ister.config import split_host_port
from ister.errors import ConfigError
from ister.wire.gen import DanubeAdmin_pb2 as pb
from ister.wire.gen import DanubeAdmin_pb2_grpc as pb_grpc
from ister.wire.gen import ister_v1_pb2 as ister_pb
from ister.wire.gen import ister_v1_pb2_grpc as ister_pb_grpc

DEFAULT_ADMIN_ADDR = "127.0.0.1:50051"
ADMIN_ADDR_ENV = "ISTER_ADMIN_ADDR"
CALL_TIMEOUT_SECONDS = 30.0
UNLOAD_TIMEOUT_SECONDS = 75.0

T = TypeVar("T")

admin_app = typer.Typer(
    no_args_is_help=True, add_completion=False, help="Administer brokers through the admin gRPC API."
)
topics_app = typer.Typer(no_args_is_help=True, help="Topics: list, describe, create, delete, unload, ...")
namespaces_app = typer.Typer(
    no_args_is_help=True, help="Namespaces: list, create, delete, policies, set-replication."
)
brokers_app = typer.Typer(
    no_args_is_help=True, help="Brokers: list, leader, drain, activate, balance, rebalance."
)
admin_app.add_typer(topics_app, name="topics")
admin_app.add_typer(namespaces_app, name="namespaces")
admin_app.add_typer(brokers_app, name="brokers")
app.add_typer(admin_app, name="admin")


@admin_app.callback()
def _admin_root(token: TokenOpt = None, tls_ca: TlsCaOpt = None, api_key_value: ApiKeyOpt = None) -> None:
    """Administer brokers through the admin gRPC API (`--token`/`--api-key`/`--tls-ca` before the
    subcommand)."""
    use(token, tls_ca, api_key_value)


class Output(StrEnum):
    table = "table"
    json = "json"


AdminAddr = Annotated[
    str,
    typer.Option(
        "--admin-addr", envvar=ADMIN_ADDR_ENV, help="the broker's admin API, HOST:PORT (or http://HOST:PORT)"
    ),
]
OutputOpt = Annotated[Output, typer.Option("--output", "-o", help="table or json")]
TopicArg = Annotated[str, typer.Argument(help="topic name, /namespace/topic")]
SubscriptionOpt = Annotated[str, typer.Option("--subscription", "-s", help="subscription name")]
# Checked by the broker (1..5, 1..factor): one place for the rules, and its messages name the factor that
# applies when only the minimum is given.
ReplicationFactorOpt = Annotated[
    int | None,
    typer.Option("--replication-factor", help="copies of each topic in a cluster (1..5)"),
]
MinInsyncOpt = Annotated[
    int | None,
    typer.Option("--min-insync", help="in-sync copies a publish needs (1..replication factor)"),
]


# -- plumbing -------------------------------------------------------------------------------------------


class AdminCallError(Exception):
    """A failed admin call, with the message the CLI prints."""


@dataclass
class Stubs:
    topics: Any
    namespaces: Any
    brokers: Any
    security: Any = None
    ister_admin: Any = None  # ister.v1.IsterAdmin: API keys


def target_of(addr: str) -> str:
    """`HOST:PORT` from `HOST:PORT` or `http://HOST:PORT`; a usage error otherwise."""
    raw = addr.strip()
    for scheme in ("http://", "grpc://", "https://"):
        if raw.startswith(scheme):
            raw = raw[len(scheme) :]
    raw = raw.rstrip("/")
    if "://" in raw:
        raise typer.BadParameter(f"{addr!r}: use HOST:PORT, http:// or https://", param_hint="--admin-addr")
    try:
        host, port = split_host_port(raw, "--admin-addr")
    except ConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint="--admin-addr") from None
    return f"{host}:{port}"


def describe_rpc_error(exc: grpc.RpcError, addr: str) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    text = (details or "").lower()
    # The channel's own failure names the admin port; a broker's UNAVAILABLE answer (etcd down, say) may
    # also say "failed to connect", about something else, and is shown as the broker wrote it.
    port = addr.rpartition(":")[2]
    if (
        code == grpc.StatusCode.UNAVAILABLE
        and ("connect" in text or "refused" in text)
        and f":{port}" in text
    ):
        return (
            f"cannot reach the admin API at {addr}: connection refused or unreachable "
            f"(is the broker running with --admin-addr {addr}? set --admin-addr or {ADMIN_ADDR_ENV})"
        )
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"the admin API at {addr} did not answer within {CALL_TIMEOUT_SECONDS:.0f} s"
    name = code.name if code is not None else "UNKNOWN"
    return f"{details} ({name})"


@contextmanager
def connect(addr: str) -> Iterator[Stubs]:
    target = target_of(addr)
    channel = admin_channel(addr, target)
    try:
        yield Stubs(
            pb_grpc.TopicAdminStub(channel),
            pb_grpc.NamespaceAdminStub(channel),
            pb_grpc.BrokerAdminStub(channel),
            pb_grpc.SecurityAdminStub(channel),
            ister_pb_grpc.IsterAdminStub(channel),
        )
    except grpc.RpcError as exc:
        raise AdminCallError(describe_rpc_error(exc, target)) from None
    finally:
        channel.close()


def exchange_api_key(key: str, target: str) -> None:
    """Exchange the API key for a token at the admin port (`Ister.ExchangeApiKey`, over TLS); the token
    then serves every call of this process (and its children). Prints the error and exits 1 on failure."""
    channel = grpc.secure_channel(target, Credentials(tls_ca=current().tls_ca).channel_credentials())
    try:
        resp = ister_pb_grpc.IsterStub(channel).ExchangeApiKey(
            ister_pb.ExchangeApiKeyRequest(api_key=key), timeout=CALL_TIMEOUT_SECONDS
        )
    except grpc.RpcError as exc:
        fail(f"exchanging the API key: {describe_rpc_error(exc, target)}")
    finally:
        channel.close()
    os.environ[TOKEN_ENV] = resp.token


def admin_channel(addr: str, target: str) -> Any:
    """Plaintext, or TLS for an https:// address, a --tls-ca, a --token or an --api-key (exchanged for a
    token first; both need TLS)."""
    key = api_key()
    if key:
        exchange_api_key(key, target)
    creds = current()
    if creds.tls or addr.strip().startswith("https://"):
        return grpc.secure_channel(target, creds.channel_credentials())
    return grpc.insecure_channel(target)


def call_admin(addr: str, service: str, method: str, request: Any) -> Any:
    """One admin RPC (`service` names a field of `Stubs`); failures print `error: ...` and exit 1."""
    return call(addr, lambda s: getattr(getattr(s, service), method)(request, timeout=CALL_TIMEOUT_SECONDS))


def call(addr: str, fn: Callable[[Stubs], T]) -> T:
    """Run `fn` against the admin API; print `error: ...` and exit 1 when it fails."""
    try:
        with connect(addr) as stubs:
            return fn(stubs)
    except AdminCallError as exc:
        fail(str(exc))


def fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(1)


def topic_name(raw: str) -> str:
    """`/ns/topic`; `ns/topic` is accepted too (the broker validates the rest)."""
    raw = raw.strip()
    return raw if raw.startswith("/") else f"/{raw}"


def emit_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, sort_keys=False))


def emit_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Aligned columns for people; cells are shown with str() (numbers too)."""
    if not rows:
        typer.echo("(none)")
        return
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    typer.echo("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip())
    for row in cells:
        typer.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def emit_fields(fields: Sequence[tuple[str, str]]) -> None:
    width = max(len(k) for k, _ in fields)
    for key, value in fields:
        typer.echo(f"{(key + ':').ljust(width + 1)} {value}")


def emit_done(output: Output, message: str, **extra: Any) -> None:
    if output == Output.json:
        emit_json({"success": True, **extra})
    else:
        typer.echo(message)


def _timeout() -> dict[str, float]:
    return {"timeout": CALL_TIMEOUT_SECONDS}


def _topic_rows(response: Any) -> list[dict[str, str]]:
    return [{"name": t.name, "broker_id": t.broker_id, "delivery": t.delivery} for t in response.topics]


# -- topics ---------------------------------------------------------------------------------------------


@topics_app.command("list")
def topics_list(
    namespace: Annotated[
        str | None, typer.Option("--namespace", "-n", help="topics of this namespace")
    ] = None,
    broker: Annotated[
        str | None, typer.Option("--broker", "-b", help="topics owned by this broker id")
    ] = None,
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> None:
    """List the topics of a namespace (--namespace) or of a broker (--broker)."""
    if (namespace is None) == (broker is None):
        raise typer.BadParameter("give exactly one of them", param_hint="--namespace / --broker")
    if namespace is not None:
        request = pb.NamespaceRequest(name=namespace)
        response = call(admin_addr, lambda s: s.topics.ListNamespaceTopics(request, **_timeout()))
    else:
        request = pb.BrokerRequest(broker_id=broker)
        response = call(admin_addr, lambda s: s.topics.ListBrokerTopics(request, **_timeout()))
    rows = _topic_rows(response)
    if output == Output.json:
        emit_json(rows)
    else:
        emit_table(
            ["TOPIC", "BROKER", "DELIVERY"], [[r["name"], r["broker_id"] or "-", r["delivery"]] for r in rows]
        )


def _replication_of(described: Any) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """A replicated topic's part of `topics describe`: (JSON fields, table rows); empty for others."""
    if not described.replicas:
        return {}, []
    lag = described.replica_lag
    info: dict[str, Any] = {
        "replicas": [str(b) for b in described.replicas],
        "in_sync_replicas": [str(b) for b in described.in_sync_replicas],
        "min_insync_replicas": described.min_insync_replicas,
        "leader_epoch": described.leader_epoch,
        "replica_lag": {str(b): n for b, n in sorted(lag.items())},
    }
    fields = [
        ("Replicas", ", ".join(str(b) for b in described.replicas)),
        (
            "In sync",
            f"{', '.join(str(b) for b in described.in_sync_replicas)} "
            f"(min {described.min_insync_replicas}, epoch {described.leader_epoch})",
        ),
    ]
    if described.HasField("replication_state"):
        info["replication_state"] = described.replication_state
        fields.append(("Replication", described.replication_state))
    if lag:
        fields.append(("Follower lag", ", ".join(f"{b}: {n}" for b, n in sorted(lag.items()))))
    return info, fields


@topics_app.command("describe")
def topics_describe(
    topic: TopicArg, admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR, output: OutputOpt = Output.table
) -> None:
    """Owner, delivery and subscriptions of a topic, the consumers streaming from the asked broker (and the
    partitions of a partitioned topic)."""
    name = topic_name(topic)

    def run(s: Stubs) -> tuple[Any, list[dict[str, str]]]:
        described = s.topics.DescribeTopic(pb.DescribeTopicRequest(name=name), **_timeout())
        namespace = name.split("/")[1] if name.count("/") == 2 else ""
        listing = s.topics.ListNamespaceTopics(pb.NamespaceRequest(name=namespace), **_timeout())
        pattern = re.compile(re.escape(name) + r"-part-(0|[1-9][0-9]*)$")
        parts = [r for r in _topic_rows(listing) if pattern.match(r["name"])]
        if any(r["name"] == name for r in _topic_rows(listing)):
            parts = []  # a plain topic; names that merely start like it are not its partitions
        parts.sort(key=lambda r: int(r["name"].rsplit("-part-", 1)[1]))
        return described, parts

    described, parts = call(admin_addr, run)
    info: dict[str, Any] = {
        "name": described.name,
        "broker_id": described.broker_id,
        "delivery": described.delivery,
        "subscriptions": list(described.subscriptions),
    }
    if described.HasField("schema_subject"):
        info["schema_subject"] = described.schema_subject
    replication_info, replication_fields = _replication_of(described)
    info.update(replication_info)
    if described.attached_consumers:
        info["attached_consumers"] = [
            {"subscription": a.subscription, "consumer": a.consumer_name}
            for a in described.attached_consumers
        ]
    if parts:
        info["partitions"] = parts
    if output == Output.json:
        emit_json(info)
        return
    fields = [
        ("Topic", described.name),
        ("Broker", described.broker_id or ("-" if not parts else "(per partition)")),
        ("Delivery", described.delivery),
        ("Subscriptions", ", ".join(described.subscriptions) or "(none)"),
    ]
    if described.HasField("schema_subject"):
        fields.append(("Schema subject", described.schema_subject))
    fields += replication_fields
    if described.attached_consumers:
        streaming = ", ".join(f"{a.consumer_name} ({a.subscription})" for a in described.attached_consumers)
        fields.append(("Consumers streaming here", streaming))
    if parts:
        fields.append(("Partitions", str(len(parts))))
    emit_fields(fields)
    if parts:
        typer.echo("")
        emit_table(
            ["PARTITION", "BROKER", "DELIVERY"],
            [[p["name"], p["broker_id"] or "-", p["delivery"]] for p in parts],
        )


@topics_app.command("create")
def topics_create(
    topic: TopicArg,
    partitions: Annotated[
        int | None, typer.Option("--partitions", "-p", min=1, help="create a partitioned topic")
    ] = None,
    reliable: Annotated[
        bool,
        typer.Option(
            "--reliable/--non-reliable",
            help="Reliable (the default: WAL, at-least-once) or NonReliable (in memory, at-most-once)",
        ),
    ] = True,
    schema_subject: Annotated[
        str | None, typer.Option("--schema-subject", help="bind the topic to this registered schema subject")
    ] = None,
    validation_policy: Annotated[
        str, typer.Option("--validation-policy", help="with --schema-subject: none|warn|enforce")
    ] = "enforce",
    replication_factor: ReplicationFactorOpt = None,
    min_insync: MinInsyncOpt = None,
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> None:
    """Create a topic, or a partitioned topic with --partitions: Reliable unless --non-reliable is given.
    In a cluster, --replication-factor and --min-insync set its copies (Reliable topics; default: the
    namespace policy's, else the broker's)."""
    name = topic_name(topic)
    strategy = pb.Reliable if reliable else pb.NonReliable
    delivery = "Reliable" if reliable else "NonReliable"
    replication = _replication_fields(replication_factor, min_insync)
    copies = "".join(f", {k} {v}" for k, v in replication.items())
    if schema_subject:
        _create_with_schema(
            name, partitions, strategy, schema_subject, validation_policy, admin_addr, replication
        )
        emit_done(
            output,
            f"created topic {name} ({delivery}{copies}) with schema subject {schema_subject} "
            f"({validation_policy})",
            topic=name,
            delivery=delivery,
            schema_subject=schema_subject,
            validation_policy=validation_policy,
            **replication,
        )
        return
    if partitions is None:
        request: Any = _with(pb.NewTopicRequest(name=name, dispatch_strategy=strategy), replication)
        call(admin_addr, lambda s: s.topics.CreateTopic(request, **_timeout()))
        emit_done(
            output, f"created topic {name} ({delivery}{copies})", topic=name, delivery=delivery, **replication
        )
    else:
        request = _with(
            pb.PartitionedTopicRequest(base_name=name, partitions=partitions, dispatch_strategy=strategy),
            replication,
        )
        call(admin_addr, lambda s: s.topics.CreatePartitionedTopic(request, **_timeout()))
        emit_done(
            output,
            f"created partitioned topic {name} with {partitions} partitions ({delivery}{copies})",
            topic=name,
            partitions=partitions,
            delivery=delivery,
            **replication,
        )


def _replication_fields(factor: int | None, min_insync: int | None) -> dict[str, int]:
    """The request fields for --replication-factor / --min-insync (only those given)."""
    fields = {"replication_factor": factor, "min_insync_replicas": min_insync}
    return {k: v for k, v in fields.items() if v is not None}


def _with(request: T, fields: dict[str, int]) -> T:
    for key, value in fields.items():
        setattr(request, key, value)
    return request


def _create_with_schema(
    name: str,
    partitions: int | None,
    strategy: Any,
    subject: str,
    policy: str,
    admin_addr: str,
    replication: dict[str, int],
) -> None:
    from ister.cli.schemas import set_topic_policy

    if policy.lower() not in ("none", "warn", "enforce"):
        fail(f"--validation-policy must be none, warn or enforce, not {policy!r}")
    if partitions is None:
        request: Any = _with(
            pb.NewTopicRequest(name=name, dispatch_strategy=strategy, schema_subject=subject), replication
        )
        call(admin_addr, lambda s: s.topics.CreateTopic(request, **_timeout()))
        created = [name]
    else:
        request = _with(
            pb.PartitionedTopicRequest(
                base_name=name, partitions=partitions, dispatch_strategy=strategy, schema_subject=subject
            ),
            replication,
        )
        call(admin_addr, lambda s: s.topics.CreatePartitionedTopic(request, **_timeout()))
        created = [f"{name}-part-{i}" for i in range(partitions)]
    for topic in created:
        set_topic_policy(admin_addr, topic, policy.lower(), True)


@topics_app.command("delete")
def topics_delete(
    topic: TopicArg, admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR, output: OutputOpt = Output.table
) -> None:
    """Delete a topic (a partitioned topic: every partition) with its subscriptions and messages."""
    name = topic_name(topic)
    call(admin_addr, lambda s: s.topics.DeleteTopic(pb.TopicRequest(name=name), **_timeout()))
    emit_done(output, f"deleted topic {name}", topic=name)


@topics_app.command("unload")
def topics_unload(
    topic: TopicArg, admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR, output: OutputOpt = Output.table
) -> None:
    """Unload a topic from its broker (sealed; cluster mode: handed to another broker)."""
    name = topic_name(topic)
    # The broker waits for the owner to seal the topic (up to two export bounds) and reports why it could not.
    request = pb.TopicRequest(name=name)
    call(admin_addr, lambda s: s.topics.UnloadTopic(request, timeout=UNLOAD_TIMEOUT_SECONDS))
    emit_done(output, f"unloaded topic {name}", topic=name)


def _partition_rows(addr: str, topic: str) -> list[Any]:
    """The partition map of `topic`'s Failover subscriptions; none from a broker without the call."""
    request = ister_pb.ListPartitionAssignmentsRequest(topic=topic)
    try:
        with connect(addr) as stubs:
            return list(stubs.ister_admin.ListPartitionAssignments(request, **_timeout()).assignments)
    except AdminCallError:
        return []


@topics_app.command("subscriptions")
def topics_subscriptions(
    topic: TopicArg,
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
    partition_map: Annotated[
        bool, typer.Option("--partition-map", help="JSON: also the partition -> consumer map")
    ] = False,
    partitions: Annotated[bool, typer.Option("--partitions", hidden=True)] = False,  # the old name
) -> None:
    """The subscriptions of a topic and, for a partitioned topic's Failover subscriptions, which consumer
    has each partition (as the broker at --admin-addr holds it)."""
    name = topic_name(topic)
    response = call(
        admin_addr, lambda s: s.topics.ListSubscriptions(pb.TopicRequest(name=name), **_timeout())
    )
    subs = list(response.subscriptions)
    rows = _partition_rows(admin_addr, name)
    if output == Output.json:
        if not (partition_map or partitions):
            emit_json(subs)
            return
        emit_json(
            {
                "subscriptions": subs,
                "partitions": [
                    {
                        "subscription": r.subscription,
                        "partition": r.partition,
                        "consumer": r.consumer or None,
                        "handing_off_to": r.handing_off_to or None,
                        "paused_seconds": round(r.paused_seconds, 3),
                    }
                    for r in rows
                ],
            }
        )
        return
    emit_table(["SUBSCRIPTION"], [[s] for s in subs])
    if rows:
        typer.echo("")
        emit_table(
            ["SUBSCRIPTION", "PARTITION", "CONSUMER", "HANDOFF"],
            [
                [
                    r.subscription,
                    str(r.partition),
                    r.consumer or "-",
                    f"to {r.handing_off_to} ({r.paused_seconds:.1f} s)" if r.handing_off_to else "-",
                ]
                for r in rows
            ],
        )


@topics_app.command("unsubscribe")
def topics_unsubscribe(
    topic: TopicArg,
    subscription: SubscriptionOpt,
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> None:
    """Remove a subscription (refused while a consumer is connected to it)."""
    name = topic_name(topic)
    request = pb.SubscriptionRequest(topic=name, subscription=subscription)
    call(admin_addr, lambda s: s.topics.Unsubscribe(request, **_timeout()))
    emit_done(output, f"removed subscription {subscription} of {name}", topic=name, subscription=subscription)


class Backoff(StrEnum):
    fixed = "fixed"
    exponential = "exponential"


class Poison(StrEnum):
    dead_letter = "dead_letter"
    block = "block"
    drop = "drop"


_BACKOFF = {Backoff.fixed: pb.Fixed, Backoff.exponential: pb.Exponential}
_POISON = {Poison.dead_letter: pb.DeadLetter, Poison.block: pb.Block, Poison.drop: pb.Drop}
_BACKOFF_NAMES = {pb.Fixed: "Fixed", pb.Exponential: "Exponential"}
_POISON_NAMES = {pb.DeadLetter: "DeadLetter", pb.Block: "Block", pb.Drop: "Drop"}


@topics_app.command("set-failure-policy")
def topics_set_failure_policy(
    topic: TopicArg,
    subscription: SubscriptionOpt,
    max_redelivery_count: Annotated[int, typer.Option("--max-redelivery-count", min=0)],
    ack_timeout_ms: Annotated[int, typer.Option("--ack-timeout-ms", min=1)],
    base_redelivery_delay_ms: Annotated[int, typer.Option("--base-redelivery-delay-ms", min=0)],
    max_redelivery_delay_ms: Annotated[int, typer.Option("--max-redelivery-delay-ms", min=0)],
    poison_policy: Annotated[Poison, typer.Option("--poison-policy")],
    backoff_strategy: Annotated[Backoff, typer.Option("--backoff-strategy")] = Backoff.fixed,
    dead_letter_topic: Annotated[str | None, typer.Option("--dead-letter-topic")] = None,
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> None:
    """Store a Reliable subscription's failure policy (used when the subscription next opens)."""
    name = topic_name(topic)
    policy = pb.SubscriptionFailurePolicy(
        max_redelivery_count=max_redelivery_count,
        ack_timeout_ms=ack_timeout_ms,
        base_redelivery_delay_ms=base_redelivery_delay_ms,
        max_redelivery_delay_ms=max_redelivery_delay_ms,
        backoff_strategy=_BACKOFF[backoff_strategy],
        poison_policy=_POISON[poison_policy],
    )
    if dead_letter_topic is not None:
        policy.dead_letter_topic = topic_name(dead_letter_topic)
    request = pb.SetSubscriptionFailurePolicyRequest(
        topic=name, subscription=subscription, failure_policy=policy
    )
    call(admin_addr, lambda s: s.topics.SetSubscriptionFailurePolicy(request, **_timeout()))
    emit_done(
        output,
        f"stored the failure policy of {subscription} on {name}",
        topic=name,
        subscription=subscription,
    )


@topics_app.command("get-failure-policy")
def topics_get_failure_policy(
    topic: TopicArg,
    subscription: SubscriptionOpt,
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> None:
    """A subscription's stored failure policy and type."""
    name = topic_name(topic)
    request = pb.GetSubscriptionFailurePolicyRequest(topic=name, subscription=subscription)
    response = call(admin_addr, lambda s: s.topics.GetSubscriptionFailurePolicy(request, **_timeout()))
    policy: dict[str, Any] | None = None
    if response.HasField("failure_policy"):
        p = response.failure_policy
        policy = {
            "max_redelivery_count": p.max_redelivery_count,
            "ack_timeout_ms": p.ack_timeout_ms,
            "base_redelivery_delay_ms": p.base_redelivery_delay_ms,
            "max_redelivery_delay_ms": p.max_redelivery_delay_ms,
            "backoff_strategy": _BACKOFF_NAMES.get(p.backoff_strategy, str(p.backoff_strategy)),
            "dead_letter_topic": p.dead_letter_topic if p.HasField("dead_letter_topic") else None,
            "poison_policy": _POISON_NAMES.get(p.poison_policy, str(p.poison_policy)),
        }
    if output == Output.json:
        emit_json({"subscription_type": response.subscription_type, "failure_policy": policy})
        return
    fields = [("Subscription type", str(response.subscription_type))]
    if policy is None:
        fields.append(("Failure policy", "(not set: the broker's defaults apply)"))
    else:
        fields.extend((k, "-" if v is None else str(v)) for k, v in policy.items())
    emit_fields(fields)


@topics_app.command("set-dispatch-config")
def topics_set_dispatch_config(
    topic: TopicArg,
    subscription: SubscriptionOpt,
    max_unacked_messages: Annotated[int | None, typer.Option("--max-unacked-messages", min=0)] = None,
    rebalance_delay: Annotated[
        float | None, typer.Option("--rebalance-delay", min=0.0, help="seconds (Failover, partitioned)")
    ] = None,
    max_handoff: Annotated[
        float | None, typer.Option("--max-handoff", min=0.0, help="seconds (Failover, partitioned)")
    ] = None,
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> None:
    """Set a Reliable subscription's window (1..10000 unacknowledged messages) and, for a Failover
    subscription on a partitioned topic (a base name sets every partition), its rebalance delay and
    handoff time. Settings not given stay as they are."""
    name = topic_name(topic)
    config = pb.SubscriptionDispatchConfig(max_unacked_messages=max_unacked_messages or 0)
    if rebalance_delay is not None:
        config.rebalance_delay_seconds = rebalance_delay
    if max_handoff is not None:
        config.max_handoff_seconds = max_handoff
    request = pb.SetSubscriptionDispatchConfigRequest(
        topic=name, subscription=subscription, dispatch_config=config
    )
    call(admin_addr, lambda s: s.topics.SetSubscriptionDispatchConfig(request, **_timeout()))
    settings = {
        k: v
        for k, v in (
            ("max_unacked_messages", max_unacked_messages),
            ("rebalance_delay_seconds", rebalance_delay),
            ("max_handoff_seconds", max_handoff),
        )
        if v is not None
    }
    shown_settings = ", ".join(f"{k}={v}" for k, v in settings.items())
    emit_done(
        output,
        f"set {shown_settings} for {subscription} on {name}",
        topic=name,
        subscription=subscription,
        **settings,
    )


@topics_app.command("get-dispatch-config")
def topics_get_dispatch_config(
    topic: TopicArg,
    subscription: SubscriptionOpt,
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> None:
    """A subscription's stored dispatch settings, if any were set."""
    name = topic_name(topic)
    request = pb.GetSubscriptionDispatchConfigRequest(topic=name, subscription=subscription)
    response = call(admin_addr, lambda s: s.topics.GetSubscriptionDispatchConfig(request, **_timeout()))
    c = response.dispatch_config if response.HasField("dispatch_config") else None
    values = {
        "max_unacked_messages": (c.max_unacked_messages or None) if c is not None else None,
        "rebalance_delay_seconds": c.rebalance_delay_seconds
        if c is not None and c.HasField("rebalance_delay_seconds")
        else None,
        "max_handoff_seconds": c.max_handoff_seconds
        if c is not None and c.HasField("max_handoff_seconds")
        else None,
    }
    if output == Output.json:
        emit_json(values)
    else:
        emit_fields(
            [
                (k, "(not set: the broker's default applies)" if v is None else str(v))
                for k, v in values.items()
            ]
        )


# -- namespaces -----------------------------------------------------------------------------------------


@namespaces_app.command("list")
def namespaces_list(admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR, output: OutputOpt = Output.table) -> None:
    """Every namespace."""
    response = call(admin_addr, lambda s: s.brokers.ListNamespaces(pb.Empty(), **_timeout()))
    names = list(response.namespaces)
    if output == Output.json:
        emit_json(names)
    else:
        emit_table(["NAMESPACE"], [[n] for n in names])


@namespaces_app.command("topics")
def namespaces_topics(
    namespace: Annotated[str, typer.Argument(help="namespace")],
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> None:
    """The topics of a namespace (names only)."""
    response = call(
        admin_addr,
        lambda s: s.namespaces.GetNamespaceTopics(pb.NamespaceRequest(name=namespace), **_timeout()),
    )
    names = [topic_name(t) for t in response.topics]
    if output == Output.json:
        emit_json(names)
    else:
        emit_table(["TOPIC"], [[n] for n in names])


@namespaces_app.command("create")
def namespaces_create(
    namespace: Annotated[str, typer.Argument(help="namespace")],
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> None:
    """Create a namespace (with the broker's default policies)."""
    call(
        admin_addr, lambda s: s.namespaces.CreateNamespace(pb.NamespaceRequest(name=namespace), **_timeout())
    )
    emit_done(output, f"created namespace {namespace}", namespace=namespace)


@namespaces_app.command("delete")
def namespaces_delete(
    namespace: Annotated[str, typer.Argument(help="namespace")],
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> None:
    """Delete an empty namespace."""
    call(
        admin_addr, lambda s: s.namespaces.DeleteNamespace(pb.NamespaceRequest(name=namespace), **_timeout())
    )
    emit_done(output, f"deleted namespace {namespace}", namespace=namespace)


@namespaces_app.command("set-replication")
def namespaces_set_replication(
    namespace: Annotated[str, typer.Argument(help="namespace")],
    replication_factor: ReplicationFactorOpt = None,
    min_insync: MinInsyncOpt = None,
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> None:
    """Set a namespace's replication policy (cluster mode): the copies its Reliable topics get when they
    set none themselves. A value not given stays as it is. Applies when a topic is next loaded without
    a replica record (new topics; a replicated topic keeps its replica record)."""
    if replication_factor is None and min_insync is None:
        fail("give --replication-factor, --min-insync or both")
    fields = _replication_fields(replication_factor, min_insync)
    request = _with(ister_pb.SetNamespaceReplicationRequest(namespace=namespace), fields)
    response = call(admin_addr, lambda s: s.ister_admin.SetNamespaceReplication(request, **_timeout()))
    stored = {
        f: getattr(response, f) if response.HasField(f) else None
        for f in ("replication_factor", "min_insync_replicas")
    }
    shown_policy = ", ".join(f"{k} {'(broker default)' if v is None else v}" for k, v in stored.items())
    emit_done(output, f"namespace {namespace}: {shown_policy}", namespace=namespace, **stored)


@namespaces_app.command("policies")
def namespaces_policies(
    namespace: Annotated[str, typer.Argument(help="namespace")],
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> None:
    """A namespace's policies (0 = unlimited)."""
    response = call(
        admin_addr,
        lambda s: s.namespaces.GetNamespacePolicies(pb.NamespaceRequest(name=namespace), **_timeout()),
    )
    try:
        policies = json.loads(response.policies)
    except ValueError:
        fail(f"the broker sent policies that are not JSON: {response.policies[:200]!r}")
    if output == Output.json or not isinstance(policies, dict) or not policies:
        emit_json(policies)
    else:
        emit_fields([(str(k), str(v)) for k, v in policies.items()])
