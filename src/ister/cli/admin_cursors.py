"""`ister admin topics reset-cursor` and `ister admin topics peek` (IsterAdmin.ResetCursor / PeekMessages;
docs/admin.md). Any broker of a cluster answers: it forwards to each topic's owner."""

from __future__ import annotations

import base64
import json
import time
from typing import Annotated, Any

import typer

from ister.cli.admin import (
    DEFAULT_ADMIN_ADDR,
    AdminAddr,
    Output,
    OutputOpt,
    SubscriptionOpt,
    TopicArg,
    call,
    emit_json,
    emit_table,
    topic_name,
    topics_app,
)
from ister.core.timespec import format_time, parse_time
from ister.errors import InvalidArgument
from ister.limits import U64_MAX
from ister.wire.gen import ister_v1_pb2 as ister_pb

RESET_TIMEOUT_SECONDS = 60.0
MAX_CELL = 60


def _time_ms(text: str, hint: str) -> int:
    try:
        return parse_time(text, time.time_ns() // 1_000_000)
    except InvalidArgument as exc:
        raise typer.BadParameter(str(exc), param_hint=hint) from None


@topics_app.command("reset-cursor")
def topics_reset_cursor(
    topic: TopicArg,
    subscription: SubscriptionOpt,
    to: Annotated[
        str | None,
        typer.Option("--to", help="earliest, latest, or an OFFSET (the first offset delivered next)"),
    ] = None,
    at: Annotated[
        str | None,
        typer.Option(
            "--time",
            help="the first message published at or after this time: 2026-12-01T10:00:00Z, -30m, -2h, -7d",
        ),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="show where it would go; move nothing")] = False,
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> None:
    """Move a subscription's cursor (every partition of a partitioned topic), consumers attached or not:
    they are moved too and receive from the new position. Reliable topics."""
    if (to is None) == (at is None):
        raise typer.BadParameter("give exactly one of them", param_hint="--to / --time")
    request = ister_pb.ResetCursorRequest(topic=topic_name(topic), subscription=subscription, dry_run=dry_run)
    if at is not None:
        request.time_ms = _time_ms(at, "--time")
    elif to == "earliest":
        request.earliest = True
    elif to == "latest":
        request.latest = True
    elif to is not None and to.isascii() and to.isdigit():
        if int(to) > U64_MAX:
            raise typer.BadParameter(f"{to} is not an unsigned 64-bit offset", param_hint="--to")
        request.offset = int(to)
    else:
        raise typer.BadParameter(f"{to!r}: use earliest, latest or an offset", param_hint="--to")
    r = call(admin_addr, lambda s: s.ister_admin.ResetCursor(request, timeout=RESET_TIMEOUT_SECONDS))
    rows = [
        {
            "topic": p.topic,
            "next": p.next,
            "head": p.head,
            "backlog": max(0, p.head - p.next),
            "consumers": p.consumers,
            "epoch": str(p.epoch),
        }
        for p in r.positions
    ]
    if output == Output.json:
        emit_json({"success": True, "dry_run": dry_run, "subscription": subscription, "positions": rows})
        return
    verb = "would move" if dry_run else "moved"
    typer.echo(f"subscription {subscription}: {verb} to {to if at is None else at}")
    emit_table(
        ["TOPIC", "NEXT", "HEAD", "BACKLOG", "CONSUMERS"],
        [[x["topic"], str(x["next"]), str(x["head"]), str(x["backlog"]), str(x["consumers"])] for x in rows],
    )


@topics_app.command("peek")
def topics_peek(
    topic: TopicArg,
    start: Annotated[
        int | None, typer.Option("--from", min=0, help="the first offset shown (default: the earliest)")
    ] = None,
    at: Annotated[
        str | None,
        typer.Option(
            "--time", help="from the first message published at or after this time (as reset-cursor)"
        ),
    ] = None,
    count: Annotated[
        int, typer.Option("--count", "-n", min=1, max=1000, help="messages per topic or partition")
    ] = 10,
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> None:
    """Show stored messages of a reliable topic (each partition of a partitioned one, DLQ topics too),
    decoded by their schema, without a subscription: no cursor moves."""
    if start is not None and at is not None:
        raise typer.BadParameter("give at most one of them", param_hint="--from / --time")
    request = ister_pb.PeekMessagesRequest(topic=topic_name(topic), count=count)
    if start is not None:
        request.offset = start
    elif at is not None:
        request.time_ms = _time_ms(at, "--time")
    r = call(admin_addr, lambda s: s.ister_admin.PeekMessages(request, timeout=RESET_TIMEOUT_SECONDS))
    rows = [peeked_json(m) for m in r.messages]
    if output == Output.json:
        emit_json(rows)
        return
    emit_table(
        ["TOPIC", "OFFSET", "PUBLISHED", "PRODUCER", "KEY", "ATTRIBUTES", "VALUE"],
        [
            [
                x["topic"],
                str(x["offset"]),
                x["publish_time_iso"],
                x["producer_name"],
                x.get("key") or "",
                _clip(json.dumps(x["attributes"], sort_keys=True) if x["attributes"] else ""),
                _clip(_shown_value(x)),
            ]
            for x in rows
        ],
    )


def peeked_json(m: Any) -> dict[str, Any]:
    """A peeked record for scripts: the decoded value (JSON) when it has a schema, else the payload as text
    (UTF-8) or base64 (`payload_encoding`); ids as strings."""
    out: dict[str, Any] = {
        "topic": m.topic,
        "offset": m.offset,
        "publish_time": m.publish_time,
        "publish_time_iso": format_time(m.publish_time),
        "producer_name": m.producer_name,
        "producer_id": str(m.producer_id),
        "key": m.routing_key if m.HasField("routing_key") else None,
        "attributes": dict(sorted(m.attributes.items())),
    }
    if m.HasField("schema_id"):
        out["schema"] = {
            "subject": m.schema_subject,
            "type": m.schema_type,
            "id": str(m.schema_id),
            "version": m.schema_version if m.HasField("schema_version") else None,
        }
    if m.HasField("value_json"):
        out["value"] = json.loads(m.value_json)
    else:
        try:
            out["payload"] = m.payload.decode()
        except UnicodeDecodeError:
            out["payload"] = base64.b64encode(m.payload).decode()
            out["payload_encoding"] = "base64"
    if m.decode_error:
        out["decode_error"] = m.decode_error
    return out


def _shown_value(x: dict[str, Any]) -> str:
    if "value" in x:
        return json.dumps(x["value"], ensure_ascii=False, sort_keys=True)
    if x.get("payload_encoding") == "base64":
        raw = base64.b64decode(x["payload"])
        return repr(raw)  # bytes escaped: b'\x00\x01...'
    return str(x["payload"])


def _clip(text: str) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"
