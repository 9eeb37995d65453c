"""`ister admin topics stats TOPIC` (Pulsar's `topics stats`) and `ister admin subscriptions list`
(`kafka-consumer-groups --describe --all-groups`): docs/admin.md, "Stats". Any broker's admin address
will do; the broker asks the topic's owner (and, for the listing, every broker of the cluster)."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Annotated, Any

import typer
from google.protobuf.message import Message  # type: ignore[import-untyped]

from ister.cli.admin import (
    DEFAULT_ADMIN_ADDR,
    AdminAddr,
    Output,
    OutputOpt,
    TopicArg,
    admin_app,
    call,
    emit_fields,
    emit_json,
    emit_table,
    topic_name,
    topics_app,
)
from ister.ids import counted
from ister.wire.gen import ister_v1_pb2 as pb

CALL_TIMEOUT_SECONDS = 30.0

subscriptions_app = typer.Typer(
    no_args_is_help=True, help="Subscriptions of the whole cluster: backlog and lag, most lagging first."
)
admin_app.add_typer(subscriptions_app, name="subscriptions")


# -- JSON -------------------------------------------------------------------------------------------------
def as_json(msg: Message) -> dict[str, Any]:
    """Every field by its proto name (absent optional ones as null); ids are strings in the proto already,
    counts and offsets are JSON numbers."""
    out: dict[str, Any] = {}
    for f in msg.DESCRIPTOR.fields:
        value = getattr(msg, f.name)
        is_map = f.message_type is not None and f.message_type.GetOptions().map_entry
        if is_map:
            out[f.name] = {str(k): value[k] for k in sorted(value)}
        elif f.is_repeated:
            out[f.name] = [as_json(v) if f.message_type is not None else v for v in value]
        elif f.message_type is not None:
            out[f.name] = as_json(value) if msg.HasField(f.name) else None
        elif f.has_presence and not msg.HasField(f.name):
            out[f.name] = None
        else:
            out[f.name] = value
    return out


# -- formatting -------------------------------------------------------------------------------------------
def size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def rate(value: float) -> str:
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"


def age(ms: int) -> str:
    if ms <= 0:
        return "0s"
    s = ms / 1000
    if s < 120:
        return f"{s:.1f}s"
    if s < 7200:
        return f"{s / 60:.1f}m"
    return f"{s / 3600:.1f}h"


def when(ms: int) -> str:
    if ms <= 0:
        return "-"
    t = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _cursor(e: pb.SubscriptionStatsEntry) -> str:
    return str(e.cursor) if e.HasField("cursor") else "-"


def _consumers(e: pb.SubscriptionStatsEntry) -> str:
    on = sum(1 for c in e.consumers if c.connected)
    return f"{on}/{len(e.consumers)}"


def _storage_line(s: pb.StorageStats) -> str:
    return (
        f"{size(s.total_bytes)} (WAL {size(s.wal_bytes)} in {counted(s.wal_segments, 'segment')}, objects "
        f"{size(s.object_bytes)} in {counted(s.objects, 'object')}, Parquet {size(s.parquet_bytes)} in "
        f"{counted(s.parquet_files, 'file')})"
    )


def _replication_line(r: pb.ReplicationStats) -> str:
    lag = ", ".join(f"{b}: {r.follower_lag[b]}" for b in sorted(r.follower_lag)) or "-"
    return (
        f"{', '.join(r.replicas)} (in sync: {', '.join(r.in_sync)}; min {r.min_insync}; "
        f"epoch {r.leader_epoch}; follower lag in records: {lag})"
    )


def _topic_fields(t: pb.TopicStats) -> list[tuple[str, str]]:
    rows = [
        ("Topic", t.topic),
        ("Delivery", t.delivery),
        ("Owner", t.owner_broker_id or "(none)"),
        ("Rate in", f"{rate(t.msg_rate_in)} msg/s, {size(int(t.byte_rate_in))}/s"),
        ("Rate out", f"{rate(t.msg_rate_out)} msg/s, {size(int(t.byte_rate_out))}/s"),
        ("Rate window", f"{t.rate_window_seconds:.1f}s"),
        ("Totals", f"in {t.messages_in_total} msg ({size(t.bytes_in_total)}), out {t.messages_out_total}"),
        ("Offsets", f"start {t.start_offset}, end {t.end_offset} ({counted(t.message_count, 'message')})"),
        ("Storage", _storage_line(t.storage)),
    ]
    if t.HasField("replication"):
        rows.append(("Replicas", _replication_line(t.replication)))
    rows.extend(("Warning", w) for w in t.warnings)
    return rows


def _tables(t: pb.TopicStats) -> None:
    typer.echo("\nProducers:")
    emit_table(
        ["NAME", "ID", "ADDRESS", "CONNECTED SINCE", "MSG/S", "BYTES/S", "MESSAGES"],
        [
            [
                p.name,
                p.producer_id,
                p.address or "-",
                when(p.connected_since_ms),
                rate(p.msg_rate_in),
                size(int(p.byte_rate_in)),
                str(p.messages_total),
            ]
            for p in t.producers
        ],
    )
    typer.echo("\nSubscriptions:")
    emit_table(
        [
            "SUBSCRIPTION",
            "TYPE",
            "CURSOR",
            "BACKLOG",
            "BACKLOG BYTES",
            "LAG",
            "UNACKED",
            "REDELIVERED",
            "DLQ",
            "MSG/S OUT",
            "CONSUMERS",
        ],
        [
            [
                e.subscription,
                e.type,
                _cursor(e),
                str(e.backlog_messages),
                size(e.backlog_bytes),
                age(e.lag_ms),
                str(e.unacked_in_flight),
                str(e.redeliveries_total),
                str(e.dead_lettered_total),
                rate(e.msg_rate_out),
                _consumers(e),
            ]
            for e in t.subscriptions
        ],
    )
    typer.echo("\nConsumers:")
    emit_table(
        ["SUBSCRIPTION", "CONSUMER", "ID", "ADDRESS", "CONNECTED SINCE", "UNACKED"],
        [
            [
                e.subscription,
                c.name,
                c.consumer_id,
                c.address or "-",
                when(c.connected_since_ms) if c.connected else "(not connected)",
                str(c.unacked),
            ]
            for e in t.subscriptions
            for c in e.consumers
        ],
    )


def _partitions_table(parts: Sequence[pb.TopicStats]) -> None:
    typer.echo("\nPartitions:")
    emit_table(
        ["PARTITION", "OWNER", "MSG/S IN", "MSG/S OUT", "MESSAGES", "BACKLOG", "STORAGE"],
        [
            [
                p.topic,
                p.owner_broker_id or "-",
                rate(p.msg_rate_in),
                rate(p.msg_rate_out),
                str(p.message_count),
                str(sum(e.backlog_messages for e in p.subscriptions)),
                size(p.storage.total_bytes),
            ]
            for p in parts
        ],
    )


# -- commands ---------------------------------------------------------------------------------------------
@topics_app.command("stats")
def topics_stats(
    topic: TopicArg, admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR, output: OutputOpt = Output.table
) -> None:
    """A topic's live numbers from its owner: rates, offsets, storage, replicas, producers, subscriptions
    (backlog, lag, unacknowledged, redeliveries, DLQ) and consumers. A partitioned topic: the sum, then
    each partition."""
    request = pb.TopicStatsRequest(topic=topic_name(topic))
    r = call(admin_addr, lambda s: s.ister_admin.GetTopicStats(request, timeout=CALL_TIMEOUT_SECONDS))
    if output == Output.json:
        emit_json({**as_json(r.total), "partitions": [as_json(p) for p in r.partitions]})
        return
    emit_fields(_topic_fields(r.total))
    _tables(r.total)
    if r.partitions:
        _partitions_table(r.partitions)


@subscriptions_app.command("list")
def subscriptions_list(
    namespace: Annotated[str | None, typer.Option("--namespace", help="only this namespace's")] = None,
    lagging: Annotated[bool, typer.Option("--lagging", help="only subscriptions with a backlog")] = False,
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> None:
    """Every subscription of the cluster with its backlog and lag (age of its oldest unacknowledged
    message), most lagging first. Exit status 1 when a broker did not answer (what the others said is
    still shown)."""
    request = pb.ListSubscriptionStatsRequest(namespace=namespace or "", lagging=lagging)
    r = call(admin_addr, lambda s: s.ister_admin.ListSubscriptionStats(request, timeout=CALL_TIMEOUT_SECONDS))
    if output == Output.json:
        emit_json(as_json(r))
    else:
        emit_table(
            [
                "TOPIC",
                "SUBSCRIPTION",
                "TYPE",
                "BACKLOG",
                "BACKLOG BYTES",
                "LAG",
                "CURSOR",
                "UNACKED",
                "CONSUMERS",
                "OWNER",
            ],
            [
                [
                    e.topic,
                    e.subscription,
                    e.type,
                    str(e.backlog_messages),
                    size(e.backlog_bytes),
                    age(e.lag_ms),
                    _cursor(e),
                    str(e.unacked_in_flight),
                    _consumers(e),
                    e.owner_broker_id or "-",
                ]
                for e in r.subscriptions
            ],
        )
    for failed in r.failed_brokers:
        typer.echo(f"warning: broker {failed.broker_id} did not answer: {failed.error}", err=True)
    if r.failed_brokers:
        raise typer.Exit(1)
