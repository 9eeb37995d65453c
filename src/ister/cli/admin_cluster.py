"""`ister admin cluster health`: the cluster's health picture in one call (`IsterAdmin.GetClusterHealth`):
recent rebalancing moves with their reasons, failed moves, and under-replicated and under-min-ISR topics.

A standalone broker answers with empty lists and a note saying why; the command prints the note. Broker
ids are strings in `-o json`, as in every admin command (u64s lose digits as JSON numbers).
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from ister.cli.admin import DEFAULT_ADMIN_ADDR, AdminAddr, Output, OutputOpt, admin_app
from ister.cli.admin_show import emit_table
from ister.cli.admin_spec import Spec, admin_command, rpc
from ister.ids import counted
from ister.wire.gen import ister_v1_pb2 as ister_pb

cluster_app = typer.Typer(no_args_is_help=True, help="The cluster as a whole: health.")
admin_app.add_typer(cluster_app, name="cluster")


def _when(unix_seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(unix_seconds)) if unix_seconds else "-"


def _ids(values: Any) -> list[str]:
    return [str(v) for v in values]


def _issue(i: Any) -> dict[str, Any]:
    return {
        "topic": i.topic,
        "state": i.state,
        "replicas": _ids(i.replicas),
        "in_sync_replicas": _ids(i.in_sync_replicas),
        "live_in_sync": _ids(i.live_in_sync),
        "min_insync_replicas": i.min_insync_replicas,
        "leader": str(i.leader) if i.HasField("leader") else None,
    }


def health_json(r: Any) -> dict[str, Any]:
    return {
        "mode": r.mode,
        "note": r.note,
        "replicated_topics": r.replicated_topics,
        "moves_total": r.moves_total,
        "moves": [
            {
                "topic": m.topic,
                "from": str(m.from_broker),
                "to": str(m.to_broker),
                "reason": m.reason,
                "estimated_load": m.estimated_load,
                "timestamp": m.timestamp,
            }
            for m in r.moves
        ],
        "failed_moves": [
            {
                "topic": f.topic,
                "from": str(f.from_broker),
                "cause": f.cause,
                "code": f.code,
                "at": f.at,
                "failures": f.failures,
                "backing_off": f.backing_off,
                "retry_at": f.retry_at,
            }
            for f in r.failed_moves
        ],
        "under_replicated": [_issue(i) for i in r.under_replicated],
        "under_min_isr": [_issue(i) for i in r.under_min_isr],
    }


def _issue_rows(issues: list[dict[str, Any]]) -> list[list[object]]:
    return [
        [
            i["topic"],
            i["state"],
            ", ".join(i["replicas"]),
            ", ".join(i["live_in_sync"]) or "-",
            i["min_insync_replicas"],
            i["leader"] or "-",
        ]
        for i in issues
    ]


def health_line(h: dict[str, Any]) -> str:
    failed = counted(len(h["failed_moves"]), "failed move")
    return (
        f"cluster: {len(h['under_replicated'])} under-replicated and {len(h['under_min_isr'])} under-min-ISR "
        f"of {counted(h['replicated_topics'], 'replicated topic')}, {failed}, "
        f"{counted(h['moves_total'], 'rebalancing move')} kept"
    )


def health_table(r: Any) -> None:
    h = health_json(r)
    if h["mode"] == "standalone":
        typer.echo(f"standalone: {h['note']}")
        return
    typer.echo(health_line(h))
    issue_headers = ["TOPIC", "STATE", "REPLICAS", "LIVE IN SYNC", "MIN", "LEADER"]
    typer.echo("\nUnder min in-sync (publishes are refused):")
    emit_table(issue_headers, _issue_rows(h["under_min_isr"]))
    typer.echo("\nUnder-replicated:")
    emit_table(issue_headers, _issue_rows(h["under_replicated"]))
    typer.echo("\nFailed moves (the owner kept the topic):")
    emit_table(
        ["TOPIC", "FROM", "FAILURES", "LAST (UTC)", "RETRY (UTC)", "CAUSE"],
        [
            [
                f["topic"],
                f["from"],
                f["failures"],
                _when(f["at"]),
                _when(f["retry_at"]) if f["backing_off"] else "now",
                f["cause"],
            ]
            for f in h["failed_moves"]
        ],
    )
    typer.echo(f"\nRecent rebalancing moves ({len(h['moves'])} of {h['moves_total']}, newest first):")
    emit_table(
        ["TIME (UTC)", "TOPIC", "FROM", "TO", "REASON", "EST. LOAD"],
        [
            [_when(m["timestamp"]), m["topic"], m["from"], m["to"], m["reason"], f"{m['estimated_load']:.2f}"]
            for m in h["moves"]
        ],
    )


@admin_command(cluster_app, "health")
def cluster_health(
    moves: Annotated[
        int, typer.Option("--moves", min=1, max=1000, help="the newest rebalancing moves to list")
    ] = 20,
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> Spec[Any]:
    """Recent rebalancing moves and why, failed moves, and under-replicated and under-min-ISR topics."""
    ask = rpc("ister_admin", "GetClusterHealth", ister_pb.ClusterHealthRequest(max_moves=moves))
    return Spec(ask, health_table, health_json)
