"""`ister admin brokers ...`: list, leader, drain (with `--wait`), activate, balance, load, rebalance.

Broker ids are u64: `-o json` writes every one of them as a string (a JSON number above 2^53 loses its low
digits in jq and JavaScript), as `ister admin brokers list` and `topics describe` always did. Commands that
exist only in a cluster answer a standalone broker with one line saying why (the broker's
FAILED_PRECONDITION message).
"""

from __future__ import annotations

import sys
import time
from typing import Annotated, Any

import typer

from ister.cli.admin import (
    DEFAULT_ADMIN_ADDR,
    AdminAddr,
    Output,
    OutputOpt,
    Stubs,
    brokers_app,
    call,
    emit_json,
    emit_table,
    fail,
)
from ister.wire.gen import DanubeAdmin_pb2 as pb
from ister.wire.gen import ister_v1_pb2 as ister_pb

CALL_TIMEOUT_SECONDS = 30.0
DRAIN_POLL_SECONDS = 0.5  # `drain --wait`: how often the broker's topics are counted
DRAIN_WAIT_SECONDS = 600.0  # `drain --wait` gives up after this long by default
DRAINED = "drained"


def _timeout() -> dict[str, float]:
    return {"timeout": CALL_TIMEOUT_SECONDS}


def broker_id_text(value: int | str) -> str:
    """A u64 broker id as JSON carries it: a decimal string."""
    return str(value)


@brokers_app.command("list")
def brokers_list(admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR, output: OutputOpt = Output.table) -> None:
    """Every registered broker, with its role and state."""
    response = call(admin_addr, lambda s: s.brokers.ListBrokers(pb.Empty(), **_timeout()))
    rows = [
        {
            "broker_id": broker_id_text(b.broker_id),
            "broker_addr": b.broker_addr,
            "admin_addr": b.admin_addr,
            "metrics_addr": b.metrics_addr,
            "broker_role": b.broker_role,
            "broker_status": b.broker_status,
        }
        for b in response.brokers
    ]
    if output == Output.json:
        emit_json(rows)
        return
    emit_table(
        ["ID", "ADDRESS", "ADMIN", "METRICS", "ROLE", "STATUS"],
        [
            [
                r["broker_id"],
                r["broker_addr"],
                r["admin_addr"] or "-",
                r["metrics_addr"] or "-",
                r["broker_role"],
                r["broker_status"],
            ]
            for r in rows
        ],
    )


@brokers_app.command("leader")
def brokers_leader(admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR, output: OutputOpt = Output.table) -> None:
    """The id of the cluster leader (`not_found` while there is none)."""
    response = call(admin_addr, lambda s: s.brokers.GetLeaderBroker(pb.Empty(), **_timeout()))
    if output == Output.json:
        emit_json({"leader": response.leader})
    else:
        typer.echo(response.leader)


@brokers_app.command("drain")
def brokers_drain(
    broker_id: Annotated[str, typer.Argument(help="the broker to drain")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="only count its topics")] = False,
    wait: Annotated[
        bool, typer.Option("--wait", help="return once the broker holds no topics (a progress bar)")
    ] = False,
    timeout: Annotated[
        float, typer.Option("--timeout", min=1.0, help="with --wait: give up after this many seconds")
    ] = DRAIN_WAIT_SECONDS,
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> None:
    """Move every topic off a broker (one at a time, through the unload path); it then gets none. With
    --wait, follow the drain until the broker holds no topics (exit 1 if it still holds some after
    --timeout seconds, naming them)."""
    request = pb.UnloadBrokerRequest(broker_id=broker_id, dry_run=dry_run)
    response = call(admin_addr, lambda s: s.brokers.UnloadBroker(request, **_timeout()))
    result: dict[str, Any] = {
        "broker_id": broker_id,
        "started": response.started,
        "total": response.total,
        "pending": response.pending,
    }
    if not wait or dry_run:
        if output == Output.json:
            emit_json(result)
        else:
            verb = "would move" if dry_run else "draining:"
            typer.echo(f"broker {broker_id} {verb} {response.total} topic(s)")
        return
    left = _follow_drain(admin_addr, broker_id, int(response.total), timeout, output == Output.table)
    if left:
        shown = ", ".join(left[:5]) + (f" and {len(left) - 5} more" if len(left) > 5 else "")
        fail(
            f"broker {broker_id} still holds {len(left)} topic(s) after {timeout:g} s: {shown} "
            f"(the broker logs say why a move did not complete)"
        )
    if output == Output.json:
        emit_json({**result, "pending": 0, "drained": True})
    else:
        typer.echo(f"broker {broker_id} drained: {response.total} topic(s) moved away")


def _drain_state(admin_addr: str, broker_id: str) -> tuple[list[str], str]:
    """(the topics assigned to the broker, its state)."""

    def run(s: Stubs) -> tuple[list[str], str]:
        topics = s.topics.ListBrokerTopics(pb.BrokerRequest(broker_id=broker_id), **_timeout())
        brokers = s.brokers.ListBrokers(pb.Empty(), **_timeout())
        status = next((b.broker_status for b in brokers.brokers if b.broker_id == broker_id), "")
        return sorted(t.name for t in topics.topics), status

    return call(admin_addr, run)


def _follow_drain(admin_addr: str, broker_id: str, total: int, within: float, bar: bool) -> list[str]:
    """Poll until the broker holds no topics and is `drained`; the topics it still holds after `within`
    seconds ([] once drained). A progress bar on stderr when it is a terminal and `bar` is set."""
    # rich is imported here, not at every `ister` start (~0.15 s of CPU).
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(file=sys.stderr)
    progress = Progress(
        TextColumn(f"draining broker {broker_id}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("topics moved"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not (bar and console.is_terminal),
    )
    deadline = time.monotonic() + within
    with progress:
        task = progress.add_task("drain", total=max(total, 1))
        while True:
            left, status = _drain_state(admin_addr, broker_id)
            done_total = max(total, len(left))
            progress.update(task, total=max(done_total, 1), completed=done_total - len(left))
            if not left and status == DRAINED:
                progress.update(task, completed=max(done_total, 1))
                return []
            if time.monotonic() >= deadline:
                return left
            time.sleep(DRAIN_POLL_SECONDS)


@brokers_app.command("activate")
def brokers_activate(
    broker_id: Annotated[str, typer.Argument(help="the broker to make active again")],
    reason: Annotated[str, typer.Option(help="recorded in its state key")] = "admin_activate",
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> None:
    """Let a drained (or draining) broker receive topics again."""
    request = pb.ActivateBrokerRequest(broker_id=broker_id, reason=reason)
    call(admin_addr, lambda s: s.brokers.ActivateBroker(request, **_timeout()))
    if output == Output.json:
        emit_json({"success": True, "broker_id": broker_id, "broker_status": "active"})
    else:
        typer.echo(f"broker {broker_id} is active")


@brokers_app.command("balance")
def brokers_balance(admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR, output: OutputOpt = Output.table) -> None:
    """The cluster's balance: CV, mean, min, max and every broker's load (cluster mode)."""
    r = call(admin_addr, lambda s: s.brokers.GetClusterBalance(pb.ClusterBalanceRequest(), **_timeout()))
    brokers = [
        {
            "broker_id": broker_id_text(b.broker_id),
            "load": b.load,
            "topic_count": b.topic_count,
            "overloaded": b.is_overloaded,
            "underloaded": b.is_underloaded,
        }
        for b in r.brokers
    ]
    summary = {
        "strategy": r.assignment_strategy,
        "cv": r.coefficient_of_variation,
        "mean": r.mean_load,
        "min": r.min_load,
        "max": r.max_load,
        "std_dev": r.std_deviation,
        "active_brokers": r.broker_count,
    }
    if output == Output.json:
        emit_json({**summary, "brokers": brokers})
        return
    typer.echo(
        f"strategy {r.assignment_strategy}: CV {r.coefficient_of_variation * 100:.1f} %, mean "
        f"{r.mean_load:.2f}, min {r.min_load:.2f}, max {r.max_load:.2f}, std {r.std_deviation:.2f}"
    )
    emit_table(
        ["BROKER", "LOAD", "TOPICS", "STATE"],
        [
            [
                b["broker_id"],
                f"{b['load']:.2f}",
                b["topic_count"],
                "overloaded" if b["overloaded"] else "underloaded" if b["underloaded"] else "-",
            ]
            for b in brokers
        ],
    )


@brokers_app.command("load")
def brokers_load(admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR, output: OutputOpt = Output.table) -> None:
    """Every live broker's latest load report: the topics it leads and the follower copies it keeps
    (cluster mode)."""
    r = call(
        admin_addr, lambda s: s.ister_admin.ListBrokerLoads(ister_pb.ListBrokerLoadsRequest(), **_timeout())
    )
    rows = [
        {
            "broker_id": broker_id_text(b.broker_id),
            "reported_at": b.timestamp,
            "cpu_percent": b.cpu_percent,
            "memory_percent": b.memory_percent,
            "topics": b.topics,
            "message_rate": b.message_rate,
            "throughput_mbps": b.throughput_mbps,
            "followed_topics": b.followed_topics,
            "follower_message_rate": b.follower_message_rate,
            "follower_throughput_mbps": b.follower_throughput_mbps,
        }
        for b in r.brokers
    ]
    if output == Output.json:
        emit_json(rows)
        return
    headers = ["BROKER", "CPU %", "MEM %", "TOPICS", "MSG/S", "MB/S", "FOLLOWED", "FOLLOWER MSG/S"]
    emit_table(
        [*headers, "FOLLOWER MB/S"],
        [
            [
                b["broker_id"],
                f"{b['cpu_percent']:.1f}",
                f"{b['memory_percent']:.1f}",
                b["topics"],
                b["message_rate"],
                f"{b['throughput_mbps']:.2f}",
                b["followed_topics"],
                b["follower_message_rate"],
                f"{b['follower_throughput_mbps']:.2f}",
            ]
            if b["reported_at"]
            else [b["broker_id"], *["-"] * 8]  # no report yet
            for b in rows
        ],
    )


@brokers_app.command("rebalance")
def brokers_rebalance(
    dry_run: Annotated[
        bool, typer.Option("--dry-run/--execute", help="print the plan (default), or start a move")
    ] = True,
    max_moves: Annotated[int | None, typer.Option("--max-moves", min=1)] = None,
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> None:
    """The rebalancing plan (--dry-run), or start its first move now (--execute; pacing applies)
    (cluster mode)."""
    request = pb.RebalanceRequest(dry_run=dry_run)
    if max_moves is not None:
        request.max_moves = max_moves
    r = call(admin_addr, lambda s: s.brokers.TriggerRebalance(request, **_timeout()))
    moves = [
        {
            "topic": m.topic_name,
            "from": broker_id_text(m.from_broker),
            "to": broker_id_text(m.to_broker),
            "estimated_load": m.estimated_load,
        }
        for m in r.proposed_moves
    ]
    if output == Output.json:
        emit_json({"moves_executed": r.moves_executed, "moves": moves, "detail": r.error_message})
        return
    typer.echo(r.error_message)
    emit_table(
        ["TOPIC", "FROM", "TO", "EST. LOAD"],
        [[m["topic"], m["from"], m["to"], f"{m['estimated_load']:.2f}"] for m in moves],
    )
