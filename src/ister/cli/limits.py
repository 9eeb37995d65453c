"""`ister admin namespaces set-limits/limits` and `ister admin topics set-limits/limits` (docs/limits.md):
rate and count limits, 0 = unlimited, applied at run time."""

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
from ister.limits import U64_MAX
from ister.wire.gen import ister_v1_pb2 as ister_pb


def _given(**values: int | None) -> dict[str, int]:
    return {name: v for name, v in values.items() if v is not None}


def _emit(output: Output, what: str, r: ister_pb.LimitsResponse) -> None:
    limits = dict(sorted(r.limits.items()))
    if output == Output.json:
        emit_json({"name": what, "limits": limits, "sources": dict(r.sources)})
        return
    rows = [("name", what)]
    for name, value in limits.items():
        source = f" ({r.sources[name]})" if name in r.sources else ""
        rows.append((name, f"{value or 'unlimited'}{source}"))
    emit_fields(rows)


@namespaces_app.command("set-limits")
def namespaces_set_limits(
    namespace: Annotated[str, typer.Argument(help="namespace")],
    publish_rate: Annotated[
        int | None, typer.Option("--publish-rate", min=0, max=U64_MAX, help="messages/s per topic")
    ] = None,
    publish_rate_bytes: Annotated[
        int | None, typer.Option("--publish-rate-bytes", min=0, max=U64_MAX, help="bytes/s per topic")
    ] = None,
    dispatch_rate: Annotated[
        int | None, typer.Option("--dispatch-rate", min=0, max=U64_MAX, help="messages/s per subscription")
    ] = None,
    max_producers: Annotated[
        int | None, typer.Option("--max-producers-per-topic", min=0, max=U64_MAX)
    ] = None,
    max_subscriptions: Annotated[
        int | None, typer.Option("--max-subscriptions-per-topic", min=0, max=U64_MAX)
    ] = None,
    max_consumers: Annotated[
        int | None, typer.Option("--max-consumers-per-topic", min=0, max=U64_MAX)
    ] = None,
    max_sub_consumers: Annotated[
        int | None, typer.Option("--max-consumers-per-subscription", min=0, max=U64_MAX)
    ] = None,
    max_topics: Annotated[
        int | None, typer.Option("--max-topics", min=0, max=U64_MAX, help="topics (each partition counts)")
    ] = None,
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> None:
    """Set a namespace's limits (0 = unlimited; a limit not given stays); they apply at once to running
    producers, subscriptions and topic creations."""
    given = _given(
        max_publish_rate=publish_rate,
        max_publish_rate_bytes=publish_rate_bytes,
        max_subscription_dispatch_rate=dispatch_rate,
        max_producers_per_topic=max_producers,
        max_subscriptions_per_topic=max_subscriptions,
        max_consumers_per_topic=max_consumers,
        max_consumers_per_subscription=max_sub_consumers,
        max_topics_per_namespace=max_topics,
    )
    if not given:
        fail("give at least one limit")
    request = ister_pb.SetLimitsRequest(namespace=namespace, limits=given)
    _emit(output, namespace, call(admin_addr, lambda s: s.ister_admin.SetLimits(request, timeout=30.0)))


@namespaces_app.command("limits")
def namespaces_limits(
    namespace: Annotated[str, typer.Argument(help="namespace")],
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> None:
    """A namespace's rate and count limits."""
    request = ister_pb.GetLimitsRequest(namespace=namespace)
    _emit(output, namespace, call(admin_addr, lambda s: s.ister_admin.GetLimits(request, timeout=30.0)))


@topics_app.command("set-limits")
def topics_set_limits(
    topic: TopicArg,
    publish_rate: Annotated[
        int | None, typer.Option("--publish-rate", min=0, max=U64_MAX, help="messages/s")
    ] = None,
    publish_rate_bytes: Annotated[
        int | None, typer.Option("--publish-rate-bytes", min=0, max=U64_MAX, help="bytes/s")
    ] = None,
    dispatch_rate: Annotated[
        int | None, typer.Option("--dispatch-rate", min=0, max=U64_MAX, help="messages/s per subscription")
    ] = None,
    clear: Annotated[bool, typer.Option("--clear", help="drop the topic's own rates")] = False,
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> None:
    """Set a topic's own rates, overriding its namespace's (each partition of a partitioned topic)."""
    given = _given(
        max_publish_rate=publish_rate,
        max_publish_rate_bytes=publish_rate_bytes,
        max_subscription_dispatch_rate=dispatch_rate,
    )
    if not given and not clear:
        fail("give at least one rate, or --clear")
    name = topic_name(topic)
    request = ister_pb.SetLimitsRequest(topic=name, limits=given, clear=clear)
    _emit(output, name, call(admin_addr, lambda s: s.ister_admin.SetLimits(request, timeout=30.0)))


@topics_app.command("limits")
def topics_limits(
    topic: TopicArg,
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> None:
    """The rates in effect for a topic and where each comes from (topic or namespace)."""
    name = topic_name(topic)
    request = ister_pb.GetLimitsRequest(topic=name)
    _emit(output, name, call(admin_addr, lambda s: s.ister_admin.GetLimits(request, timeout=30.0)))
