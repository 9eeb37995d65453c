"""`ister admin topics ...`: list, describe, create, delete, unload, subscriptions, unsubscribe; the
subscription settings (failure policy, dispatch config) are admin_sub_settings.py's. Each command builds a
spec (`admin_spec.py`)."""

from __future__ import annotations

import re
from typing import Annotated, Any

import grpc
import typer

from ister.cli.admin import (
    DEFAULT_ADMIN_ADDR,
    AdminAddr,
    MinInsyncOpt,
    Output,
    OutputOpt,
    ReplicationFactorOpt,
    Stubs,
    SubscriptionOpt,
    TopicArg,
    fail,
    replication_fields,
    topic_name,
    topics_app,
    with_fields,
)
from ister.cli.admin_call import CALL_TIMEOUT_SECONDS
from ister.cli.admin_show import emit_fields, emit_table
from ister.cli.admin_spec import Spec, admin_command, done, listing, rpc
from ister.cli.compression_show import dictionary_fields, shown
from ister.core.retention import format_duration_ms
from ister.ids import counted
from ister.wire.gen import DanubeAdmin_pb2 as pb
from ister.wire.gen import ister_v1_pb2 as ister_pb

UNLOAD_TIMEOUT_SECONDS = 75.0


def _topic_rows(response: Any) -> list[dict[str, str]]:
    return [{"name": t.name, "broker_id": t.broker_id, "delivery": t.delivery} for t in response.topics]


@admin_command(topics_app, "list")
def topics_list(
    namespace: Annotated[
        str | None, typer.Option("--namespace", "-n", help="topics of this namespace")
    ] = None,
    broker: Annotated[
        str | None, typer.Option("--broker", "-b", help="topics owned by this broker id")
    ] = None,
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> Spec[Any]:
    """List the topics of a namespace (--namespace) or of a broker (--broker)."""
    if (namespace is None) == (broker is None):
        raise typer.BadParameter("give exactly one of them", param_hint="--namespace / --broker")
    if namespace is not None:
        ask = rpc("topics", "ListNamespaceTopics", pb.NamespaceRequest(name=namespace))
    else:
        ask = rpc("topics", "ListBrokerTopics", pb.BrokerRequest(broker_id=broker))
    return listing(
        ask,
        _topic_rows,
        ["TOPIC", "BROKER", "DELIVERY"],
        lambda r: [r["name"], r["broker_id"] or "-", r["delivery"]],
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


# the topic, its partitions (none for a plain topic), its compression in effect, and its table policy
# (None: not asked or not known)
Described = tuple[Any, list[dict[str, str]], Any, Any]


def _describe(name: str) -> Any:
    def ask(s: Stubs) -> Described:
        described = s.topics.DescribeTopic(pb.DescribeTopicRequest(name=name), timeout=CALL_TIMEOUT_SECONDS)
        namespace = name.split("/")[1] if name.count("/") == 2 else ""
        listing = s.topics.ListNamespaceTopics(
            pb.NamespaceRequest(name=namespace), timeout=CALL_TIMEOUT_SECONDS
        )
        pattern = re.compile(re.escape(name) + r"-part-(0|[1-9][0-9]*)$")
        parts = [r for r in _topic_rows(listing) if pattern.match(r["name"])]
        if any(r["name"] == name for r in _topic_rows(listing)):
            parts = []  # a plain topic; names that merely start like it are not its partitions
        parts.sort(key=lambda r: int(r["name"].rsplit("-part-", 1)[1]))
        table = None
        if described.delivery == "Reliable" or parts:
            try:
                table = s.ister_admin.GetTablePolicy(
                    ister_pb.GetTablePolicyRequest(topic=name), timeout=CALL_TIMEOUT_SECONDS
                )
            except grpc.RpcError:  # an older broker, or no right to see policies: describe without it
                table = None
        return described, parts, _compression(s, name), table

    return ask


def _compression(s: Stubs, name: str) -> Any:
    """The topic's compression in effect; None from a server without the Ister admin service (an older
    broker, a bare admin server)."""
    try:
        return s.ister_admin.GetCompression(
            ister_pb.GetCompressionRequest(topic=name), timeout=CALL_TIMEOUT_SECONDS
        )
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
            return None
        raise


def _described_json(answer: Described) -> dict[str, Any]:
    described, parts, codec, table = answer
    info: dict[str, Any] = {
        "name": described.name,
        "broker_id": described.broker_id,
        "delivery": described.delivery,
        "subscriptions": list(described.subscriptions),
    }
    if codec is not None:
        info |= {"compression": codec.compression, "compression_source": codec.source}
        info |= {f"compression_{k}": v for k, v in dictionary_fields(codec).items()}
    if described.HasField("schema_subject"):
        info["schema_subject"] = described.schema_subject
    if described.HasField("schema_version"):
        info["schema_id"] = str(described.schema_id)  # a u64 id: a string
        info["schema_version"] = described.schema_version
        info["schema_type"] = described.schema_type
        info["compatibility_mode"] = described.compatibility_mode
    info.update(_replication_of(described)[0])
    if described.attached_consumers:
        info["attached_consumers"] = [
            {"subscription": a.subscription, "consumer": a.consumer_name}
            for a in described.attached_consumers
        ]
    if parts:
        info["partitions"] = parts
    if table is not None and table.tables:  # none: a NonReliable topic (no table)
        info["table"] = {
            "format": table.format,
            "format_from": table.format_source,  # the table line's "(namespace)", "(default)", ...
            "tables": list(table.tables),
            "partition": table.partition,
            "interval_ms": table.interval_ms,
        }
    return info


def _described_table(answer: Described) -> None:
    described, parts, codec, table = answer
    fields = [
        ("Topic", described.name),
        ("Broker", described.broker_id or ("-" if not parts else "(per partition)")),
        ("Delivery", described.delivery),
        ("Subscriptions", ", ".join(described.subscriptions) or "(none)"),
    ]
    if codec is not None:
        fields.append(("Compression", shown(codec)))
    if described.HasField("schema_subject"):
        fields.append(("Schema subject", described.schema_subject))
    if described.HasField("schema_version"):
        latest = f"v{described.schema_version} ({described.schema_type}, {described.compatibility_mode})"
        fields.append(("Latest schema", latest))
    fields += _replication_of(described)[1]
    if described.attached_consumers:
        streaming = ", ".join(f"{a.consumer_name} ({a.subscription})" for a in described.attached_consumers)
        fields.append(("Consumers streaming here", streaming))
    if parts:
        fields.append(("Partitions", str(len(parts))))
    if table is not None:
        fields += table_rows(table)
    emit_fields(fields)
    if parts:
        typer.echo("")
        emit_table(
            ["PARTITION", "BROKER", "DELIVERY"],
            [[p["name"], p["broker_id"] or "-", p["delivery"]] for p in parts],
        )


def table_rows(r: Any) -> list[tuple[str, str]]:
    """The line `describe` adds for a reliable topic's table policy (docs/tables.md)."""
    if not r.tables:
        return []  # a NonReliable topic's partitions: no table, whatever the policy
    if r.format != "iceberg":
        return [("Table", f"none ({r.format_source})")]
    every = format_duration_ms(r.interval_ms)
    return [("Table", f"iceberg {', '.join(r.tables)}, by publish {r.partition}, every {every}")]


@admin_command(topics_app, "describe")
def topics_describe(
    topic: TopicArg, admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR, output: OutputOpt = Output.table
) -> Spec[Described]:
    """Owner, delivery and subscriptions of a topic, the consumers streaming from the asked broker (and the
    partitions of a partitioned topic)."""
    return Spec(_describe(topic_name(topic)), _described_table, _described_json)


@admin_command(topics_app, "create")
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
) -> Spec[Any]:
    """Create a topic, or a partitioned topic with --partitions: Reliable unless --non-reliable is given.
    In a cluster, --replication-factor and --min-insync set its copies (Reliable topics; default: the
    namespace policy's, else the broker's)."""
    name = topic_name(topic)
    strategy = pb.Reliable if reliable else pb.NonReliable
    delivery = "Reliable" if reliable else "NonReliable"
    replication = replication_fields(replication_factor, min_insync)
    copies = "".join(f", {k} {v}" for k, v in replication.items())
    subject: dict[str, Any] = {"schema_subject": schema_subject} if schema_subject else {}
    if schema_subject and validation_policy.lower() not in ("none", "warn", "enforce"):
        fail(f"--validation-policy must be none, warn or enforce, not {validation_policy!r}")
    if partitions is None:
        request = pb.NewTopicRequest(name=name, dispatch_strategy=strategy)
        ask = rpc("topics", "CreateTopic", with_fields(request, replication | subject))
        created = [name]
    else:
        request = pb.PartitionedTopicRequest(
            base_name=name, partitions=partitions, dispatch_strategy=strategy
        )
        ask = rpc("topics", "CreatePartitionedTopic", with_fields(request, replication | subject))
        created = [f"{name}-part-{i}" for i in range(partitions)]
    if schema_subject:
        from ister.cli.schemas import set_topic_policy

        def create_then_set_policy(stubs: Stubs) -> Any:
            answer = ask(stubs)
            for each in created:
                set_topic_policy(admin_addr, each, validation_policy.lower(), True)
            return answer

        return done(
            create_then_set_policy,
            f"created topic {name} ({delivery}{copies}) with schema subject {schema_subject} "
            f"({validation_policy})",
            topic=name,
            delivery=delivery,
            schema_subject=schema_subject,
            validation_policy=validation_policy,
            **replication,
        )
    if partitions is None:
        return done(
            ask, f"created topic {name} ({delivery}{copies})", topic=name, delivery=delivery, **replication
        )
    return done(
        ask,
        f"created partitioned topic {name} with {counted(partitions, 'partition')} ({delivery}{copies})",
        topic=name,
        partitions=partitions,
        delivery=delivery,
        **replication,
    )


@admin_command(topics_app, "delete")
def topics_delete(
    topic: TopicArg, admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR, output: OutputOpt = Output.table
) -> Spec[Any]:
    """Delete a topic (a partitioned topic: every partition) with its subscriptions and messages."""
    name = topic_name(topic)
    return done(rpc("topics", "DeleteTopic", pb.TopicRequest(name=name)), f"deleted topic {name}", topic=name)


@admin_command(topics_app, "unload")
def topics_unload(
    topic: TopicArg, admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR, output: OutputOpt = Output.table
) -> Spec[Any]:
    """Unload a topic from its broker (sealed; cluster mode: handed to another broker)."""
    name = topic_name(topic)
    # The broker waits for the owner to seal the topic (up to two export bounds) and reports why it could not.
    ask = rpc("topics", "UnloadTopic", pb.TopicRequest(name=name), timeout=UNLOAD_TIMEOUT_SECONDS)
    return done(ask, f"unloaded topic {name}", topic=name)


Subscriptions = tuple[list[str], list[Any]]  # the names, and the partition map of Failover subscriptions


def _subscriptions(name: str) -> Any:
    def ask(s: Stubs) -> Subscriptions:
        response = s.topics.ListSubscriptions(pb.TopicRequest(name=name), timeout=CALL_TIMEOUT_SECONDS)
        request = ister_pb.ListPartitionAssignmentsRequest(topic=name)
        try:
            rows = list(
                s.ister_admin.ListPartitionAssignments(request, timeout=CALL_TIMEOUT_SECONDS).assignments
            )
        except grpc.RpcError:
            rows = []  # a broker without the call
        return list(response.subscriptions), rows

    return ask


def _subscriptions_table(answer: Subscriptions) -> None:
    subs, rows = answer
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


def _subscriptions_json(answer: Subscriptions) -> dict[str, Any]:
    subs, rows = answer
    return {
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


@admin_command(topics_app, "subscriptions")
def topics_subscriptions(
    topic: TopicArg,
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
    partition_map: Annotated[
        bool, typer.Option("--partition-map", help="JSON: also the partition -> consumer map")
    ] = False,
    partitions: Annotated[bool, typer.Option("--partitions", hidden=True)] = False,  # the old name
) -> Spec[Subscriptions]:
    """The subscriptions of a topic and, for a partitioned topic's Failover subscriptions, which consumer
    has each partition (as the broker at --admin-addr holds it)."""
    with_map = partition_map or partitions
    return Spec(
        _subscriptions(topic_name(topic)),
        _subscriptions_table,
        _subscriptions_json if with_map else lambda answer: answer[0],
    )


@admin_command(topics_app, "unsubscribe")
def topics_unsubscribe(
    topic: TopicArg,
    subscription: SubscriptionOpt,
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> Spec[Any]:
    """Remove a subscription (refused while a consumer is connected to it)."""
    name = topic_name(topic)
    return done(
        rpc("topics", "Unsubscribe", pb.SubscriptionRequest(topic=name, subscription=subscription)),
        f"removed subscription {subscription} of {name}",
        topic=name,
        subscription=subscription,
    )


# The subscription settings' commands register after the ones above (help lists them in that order).
from ister.cli import admin_sub_settings as _admin_sub_settings  # noqa: E402,F401
