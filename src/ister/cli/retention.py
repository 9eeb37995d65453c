"""`ister admin namespaces set-retention|retention` and `ister admin topics set-retention|retention`
(docs/retention.md): durations such as `30s`, `10m`, `7d`; sizes such as `512MiB`, `50GiB`; `0` =
unlimited. Standalone and cluster alike: limits are metadata, applied by each topic's owner."""

from __future__ import annotations

from typing import Annotated

import typer

from ister.cli.admin import (
    DEFAULT_ADMIN_ADDR,
    AdminAddr,
    Output,
    OutputOpt,
    TopicArg,
    call,
    emit_fields,
    emit_json,
    fail,
    namespaces_app,
    topic_name,
    topics_app,
)
from ister.core.retention import format_duration_ms, format_size_bytes, parse_duration_ms, parse_size_bytes
from ister.errors import InvalidArgument
from ister.wire.gen import ister_v1_pb2 as ister_pb

TimeOpt = Annotated[
    str | None, typer.Option("--time", help="how long records are kept: 30s, 10m, 12h, 7d; 0 = unlimited")
]
SizeOpt = Annotated[
    str | None, typer.Option("--size", help="how many bytes are kept at least: 512MiB, 50GiB; 0 = unlimited")
]


def _with_limits(
    request: ister_pb.SetRetentionRequest, time_text: str | None, size_text: str | None
) -> ister_pb.SetRetentionRequest:
    try:
        if time_text is not None:
            request.time_ms = parse_duration_ms(time_text)
        if size_text is not None:
            request.size_bytes = parse_size_bytes(size_text)
    except InvalidArgument as exc:
        fail(str(exc))
    return request


def _emit(output: Output, what: str, r: ister_pb.RetentionResponse, topic: bool) -> None:
    values = {
        "retention_time_ms": str(r.time_ms),
        "retention_size_bytes": str(r.size_bytes),
        "time_from": r.time_source,
        "size_from": r.size_source,
    }
    if topic:
        values["start_offset"] = str(r.start_offset)
    values.update(
        backlog_quota_size_bytes=str(r.backlog_quota_size_bytes),
        backlog_quota_time_ms=str(r.backlog_quota_time_ms),
        backlog_quota_policy=r.backlog_quota_policy,
        message_ttl_ms=str(r.message_ttl_ms),
    )
    if output == Output.json:
        emit_json({"name": what, **values})
        return
    rows = [
        ("name", what),
        ("retention time", f"{format_duration_ms(r.time_ms)} ({r.time_source})"),
        ("retention size", f"{format_size_bytes(r.size_bytes)} ({r.size_source})"),
    ]
    if topic:
        rows.append(("start offset", str(r.start_offset)))
    quota = [
        format_size_bytes(r.backlog_quota_size_bytes) if r.backlog_quota_size_bytes else "",
        format_duration_ms(r.backlog_quota_time_ms) if r.backlog_quota_time_ms else "",
    ]
    shown_quota = " / ".join(q for q in quota if q)
    rows.append(("backlog quota", f"{shown_quota}, {r.backlog_quota_policy}" if shown_quota else "none"))
    rows.append(("message TTL", format_duration_ms(r.message_ttl_ms) if r.message_ttl_ms else "none"))
    emit_fields(rows)


@namespaces_app.command("set-retention")
def namespaces_set_retention(
    namespace: Annotated[str, typer.Argument(help="namespace")],
    time: TimeOpt = None,
    size: SizeOpt = None,
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> None:
    """Set a namespace's retention: the limits of its topics that set none themselves (default: 7 days,
    unlimited size). A limit not given stays as it is."""
    if time is None and size is None:
        fail("give --time, --size or both")
    request = _with_limits(ister_pb.SetRetentionRequest(namespace=namespace), time, size)
    r = call(admin_addr, lambda s: s.ister_admin.SetRetention(request, timeout=30.0))
    _emit(output, namespace, r, topic=False)


@namespaces_app.command("retention")
def namespaces_retention(
    namespace: Annotated[str, typer.Argument(help="namespace")],
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> None:
    """A namespace's retention limits and where each comes from."""
    request = ister_pb.GetRetentionRequest(namespace=namespace)
    r = call(admin_addr, lambda s: s.ister_admin.GetRetention(request, timeout=30.0))
    _emit(output, namespace, r, topic=False)


@topics_app.command("set-retention")
def topics_set_retention(
    topic: TopicArg,
    time: TimeOpt = None,
    size: SizeOpt = None,
    clear: Annotated[bool, typer.Option("--clear", help="drop the topic's own limits")] = False,
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> None:
    """Set a topic's own retention (every partition of a partitioned topic), overriding its namespace's;
    `--clear` goes back to the namespace's."""
    if clear and (time is not None or size is not None):
        fail("give --time/--size or --clear, not both")
    if not clear and time is None and size is None:
        fail("give --time, --size, both, or --clear")
    name = topic_name(topic)
    request = _with_limits(ister_pb.SetRetentionRequest(topic=name, clear=clear), time, size)
    r = call(admin_addr, lambda s: s.ister_admin.SetRetention(request, timeout=30.0))
    _emit(output, name, r, topic=True)


@topics_app.command("retention")
def topics_retention(
    topic: TopicArg, admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR, output: OutputOpt = Output.table
) -> None:
    """A topic's retention limits in effect, where each comes from, and its start offset (the lowest offset
    still kept)."""
    name = topic_name(topic)
    request = ister_pb.GetRetentionRequest(topic=name)
    r = call(admin_addr, lambda s: s.ister_admin.GetRetention(request, timeout=30.0))
    _emit(output, name, r, topic=True)


@namespaces_app.command("set-backlog-quota")
def namespaces_set_backlog_quota(
    namespace: Annotated[str, typer.Argument(help="namespace")],
    size: Annotated[
        str | None, typer.Option("--size", help="most bytes the slowest subscription may be behind; 0 = none")
    ] = None,
    time: Annotated[
        str | None,
        typer.Option("--time", help="oldest unacknowledged message the slowest may have: 1h; 0 = none"),
    ] = None,
    policy: Annotated[
        str | None,
        typer.Option("--policy", help="producer_error (default), producer_hold or consumer_eviction"),
    ] = None,
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> None:
    """Bound how far a namespace's slowest subscription may fall behind (Pulsar's backlog quota). Past it,
    publishes are refused (producer_error), held then refused (producer_hold), or the slowest subscription is
    moved on (consumer_eviction). A value not given stays as it is."""
    if size is None and time is None and policy is None:
        fail("give --size, --time and/or --policy")
    request = ister_pb.SetRetentionRequest(namespace=namespace, backlog_quota_policy=policy or "")
    try:
        if size is not None:
            request.backlog_quota_size_bytes = parse_size_bytes(size)
        if time is not None:
            request.backlog_quota_time_ms = parse_duration_ms(time)
    except InvalidArgument as exc:
        fail(str(exc))
    r = call(admin_addr, lambda s: s.ister_admin.SetRetention(request, timeout=30.0))
    _emit(output, namespace, r, topic=False)


@namespaces_app.command("set-message-ttl")
def namespaces_set_message_ttl(
    namespace: Annotated[str, typer.Argument(help="namespace")],
    ttl: Annotated[str, typer.Argument(help="e.g. 1h, 7d; 0 = none")],
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> None:
    """Acknowledge, on each subscription's behalf, messages left unacknowledged longer than this (Pulsar's
    message TTL); counted in ister_message_ttl_expired_total."""
    request = ister_pb.SetRetentionRequest(namespace=namespace)
    try:
        request.message_ttl_ms = parse_duration_ms(ttl)
    except InvalidArgument as exc:
        fail(str(exc))
    r = call(admin_addr, lambda s: s.ister_admin.SetRetention(request, timeout=30.0))
    _emit(output, namespace, r, topic=False)
