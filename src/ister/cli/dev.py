"""`ister dev`: a whole cluster on this machine in one command (docs/dev.md).

`up` runs in the foreground (Ctrl-C stops it), `status`/`env`/`restart-broker`/`down` work from another
shell through the dev directory's state file, `compose` prints deploy/compose.yaml from the same service
specifications.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from ister.cli.main import app
from ister.ids import counted

DEFAULT_DIR = ".ister-dev"
DIR_ENV = "ISTER_DEV_DIR"
DOWN_SECONDS = 120.0  # bound on `down` waiting for `up` to stop everything
RESTART_SECONDS = 90.0  # bound on `restart-broker` waiting for the broker to be ready again

dev = typer.Typer(no_args_is_help=True, help="A development cluster on this machine (docs/dev.md).")
app.add_typer(dev, name="dev")

DirOption = Annotated[
    Path | None,
    typer.Option(
        "--dir", help=f"the dev directory (data, logs, state); default ${DIR_ENV} or ./{DEFAULT_DIR}"
    ),
]


def _dir(given: Path | None) -> Path:
    return (given or Path(os.environ.get(DIR_ENV) or DEFAULT_DIR)).resolve()


def _fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def _say(message: str) -> None:
    typer.echo(f"ister dev: {message}", err=True)


def _running_up(directory: Path) -> dict[str, Any] | None:
    from ister.devcluster.state import alive, read_state

    state = read_state(directory)
    if state is not None and state.get("phase") != "stopped" and alive(state.get("pid"), "dev"):
        return state
    return None


def _left_running(directory: Path) -> list[str]:
    """The services a killed `up` left running (their names and pids)."""
    from ister.devcluster.state import alive, read_state

    try:
        state = read_state(directory) or {}
    except ValueError:
        return []
    services = state.get("services", [])
    return [f"{s['name']} pid {s['pid']}" for s in services if alive(s.get("pid"), s.get("marker", ""))]


def exports(state: dict[str, Any]) -> list[str]:
    """The shell lines that point the `ister` CLI (and etcdctl, aws) at this cluster."""
    by_name = {s["name"]: s["addresses"] for s in state["services"]}
    b0 = by_name["broker-0"]
    lines = [
        f"export ISTER_SERVICE_ADDR={b0['client']}",  # ister produce / consume
        f"export ISTER_ADMIN_ADDR={b0['admin']}",  # ister admin ...
        f"export ETCDCTL_ENDPOINTS={by_name['etcd']['client']}",
    ]
    if "s3" in by_name:
        from ister.devcluster.seaweed import ACCESS_KEY, REGION, SECRET_KEY

        lines += [
            f"export AWS_ENDPOINT_URL={by_name['s3']['s3']}",
            f"export AWS_ACCESS_KEY_ID={ACCESS_KEY}",
            f"export AWS_SECRET_ACCESS_KEY={SECRET_KEY}",
            f"export AWS_REGION={REGION}",
        ]
    return lines


def table(state: dict[str, Any], live: dict[str, bool] | None = None) -> list[str]:
    """One row per address of every service."""
    rows = [("SERVICE", "PID", "ROLE", "ADDRESS")]
    for s in state["services"]:
        pid = str(s.get("pid") or "-")
        if live is not None:
            pid += "" if live.get(s["name"]) else " (not running)"
        for role, address in s["addresses"].items():
            rows.append((s["name"], pid, role, str(address)))
            pid = ""
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return ["  ".join(c.ljust(w) for c, w in zip(r[:3], widths, strict=True)) + "  " + r[3] for r in rows]


@dev.command()
def up(
    brokers: Annotated[int | None, typer.Option("--brokers", help="cluster brokers (default 3)")] = None,
    s3: Annotated[
        bool | None, typer.Option("--s3/--no-s3", help="durable tier on SeaweedFS S3 (else file://)")
    ] = None,
    console: Annotated[
        bool, typer.Option("--console", help="also serve the web console (ister console) on this machine")
    ] = False,
    fresh: Annotated[bool, typer.Option("--fresh", help="delete the dev directory's data first")] = False,
    directory: DirOption = None,
    port_base: Annotated[
        int | None, typer.Option("--port-base", help="use a block of ports from here (else the usual ones)")
    ] = None,
) -> None:
    """Start etcd, S3 (--s3) and N brokers in the foreground; Ctrl-C stops them and keeps the data."""
    from ister.devcluster.dev import DevCluster
    from ister.devcluster.ports import bindable
    from ister.devcluster.spec import plan_ports
    from ister.devcluster.state import Plan, read_plan, write_plan

    where = _dir(directory)
    running = _running_up(where)
    if running is not None:
        raise _fail(
            f"a dev cluster already runs from {where} (pid {running['pid']}); `ister dev down` stops it"
        )
    left = _left_running(where)
    if left:
        raise _fail(f"an earlier `ister dev up` left {', '.join(left)} running: `ister dev down` stops them")
    if fresh and where.exists():
        shutil.rmtree(where)
    try:
        saved = read_plan(where)
        if saved is not None:
            if (brokers is not None and brokers != saved.brokers) or (s3 is not None and s3 != saved.s3):
                raise ValueError(
                    f"{where} holds a cluster of {counted(saved.brokers, 'broker')}"
                    f"{' with S3' if saved.s3 else ''}: "
                    "start it as it is, or add --fresh to start a new one (its data is deleted)"
                )
            if port_base is not None and plan_ports(saved.brokers, port_base) != saved.ports:
                raise ValueError(
                    f"{where} was made with other ports: start it without --port-base, or --fresh"
                )
            plan = saved
        else:
            count = 3 if brokers is None else brokers
            plan = Plan(count, bool(s3), plan_ports(count, port_base))
    except ValueError as exc:
        raise _fail(str(exc), 2) from None
    named = plan.ports.named(plan.s3, console)
    busy = [f"{port} ({what})" for what, port in named if not bindable(port, reuse=True)]
    if busy:
        raise _fail(
            f"ports in use: {', '.join(busy)}; stop what listens there, or start with --fresh --port-base P "
            "(a block of free ports)"
        )
    where.mkdir(parents=True, exist_ok=True)
    write_plan(where, plan)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    cluster = DevCluster(where, plan, _say, console=console)
    try:
        try:
            not_ready = cluster.start(stop)
        except RuntimeError as exc:
            raise _fail(f"the dev cluster did not start: {exc}") from None
        state = cluster.state()
        typer.echo(
            f"ister dev: {counted(plan.brokers, 'broker')}, replication factor "
            f"{state['replication_factor']}, durable tier {state['durable_tier']}, data in {where}"
        )
        for line in table(state):
            typer.echo(line)
        typer.echo("")
        for line in exports(state):
            typer.echo(line)
        for reason in not_ready:
            typer.echo(f"ister dev: not ready yet: {reason}")
        typer.echo("ister dev: running; Ctrl-C (or `ister dev down`) stops it, the data stays", err=False)
        cluster.supervise(stop)
    finally:
        _say("stopping: brokers, then S3, then etcd")
        cluster.stop()


@dev.command()
def status(
    directory: DirOption = None,
    output: Annotated[str, typer.Option("--output", "-o", help="table or json")] = "table",
) -> None:
    """What runs: every service, its pid and addresses, and whether each broker is ready."""
    from ister.devcluster.state import alive, read_state

    if output not in ("table", "json"):
        raise _fail(f"--output must be table or json, not {output!r}", 2)
    where = _dir(directory)
    try:
        state = read_state(where)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    if state is None:
        raise _fail(f"no dev cluster in {where} (`ister dev up` starts one)")
    up_alive = alive(state.get("pid"), "dev")
    live = {s["name"]: alive(s.get("pid"), s.get("marker", "")) for s in state["services"]}
    ready = {s["name"]: _ready(s) for s in state["services"] if s["name"].startswith("broker-")}
    phase = state.get("phase", "?") if up_alive else "stopped"
    if output == "json":
        body = {**state, "phase": phase, "up_running": up_alive, "running": live, "ready": ready}
        typer.echo(json.dumps(body, indent=2, sort_keys=True))
        return
    typer.echo(f"ister dev in {where}: {phase} (up pid {state.get('pid')})")
    for line in table(state, live):
        typer.echo(line)
    for name, why in ready.items():
        typer.echo(f"{name}: {'ready' if why is None else 'not ready: ' + why}")


def _ready(service: dict[str, Any]) -> str | None:
    from ister.devcluster.dev import readiness_at

    return readiness_at(service["addresses"]["readyz"])


@dev.command()
def env(directory: DirOption = None) -> None:
    """The `export` lines for the CLI: eval "$(ister dev env)"."""
    from ister.devcluster.state import read_state

    state = read_state(_dir(directory))
    if state is None:
        raise _fail(f"no dev cluster in {_dir(directory)} (`ister dev up` starts one)")
    for line in exports(state):
        typer.echo(line)


@dev.command()
def down(directory: DirOption = None) -> None:
    """Stop the dev cluster (as Ctrl-C on `up` does); the data stays."""
    from ister.devcluster.state import alive, read_state

    where = _dir(directory)
    state = read_state(where)
    if state is None:
        raise _fail(f"no dev cluster in {where}")
    pid = state.get("pid")
    if alive(pid, "dev"):
        assert isinstance(pid, int)
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + DOWN_SECONDS
        while alive(pid, "dev"):
            if time.monotonic() > deadline:
                raise _fail(f"`ister dev up` (pid {pid}) did not stop within {DOWN_SECONDS:.0f} s")
            time.sleep(0.1)  # poll interval
        typer.echo(f"ister dev: stopped (data kept in {where})")
        return
    # `up` is gone (killed): stop what it left running, in the same order.
    from ister.devcluster.dev import stop_left_over

    stopped = stop_left_over(state, _say)
    typer.echo(
        f"ister dev: `up` was not running; stopped {stopped} left-over processes (data kept in {where})"
    )


@dev.command("restart-broker")
def restart_broker(
    index: Annotated[int, typer.Argument(help="the broker's number (broker-N in `ister dev status`)")],
    directory: DirOption = None,
) -> None:
    """Stop broker N gracefully; the running `ister dev up` starts it again. Waits until it is ready."""
    from ister.devcluster.dev import readiness_at
    from ister.devcluster.state import alive, read_state

    where = _dir(directory)
    if _running_up(where) is None:
        raise _fail(f"no `ister dev up` runs from {where}")
    state = read_state(where) or {}
    service = next((s for s in state.get("services", []) if s["name"] == f"broker-{index}"), None)
    if service is None:
        raise _fail(f"no broker-{index} in this dev cluster", 2)
    old = service.get("pid")
    if alive(old, "ister.cli"):
        assert isinstance(old, int)
        os.kill(old, signal.SIGTERM)
    deadline = time.monotonic() + RESTART_SECONDS
    while True:
        now = next(s for s in (read_state(where) or state)["services"] if s["name"] == f"broker-{index}")
        if (
            now.get("pid") != old
            and alive(now.get("pid"), "ister.cli")
            and readiness_at(now["addresses"]["readyz"]) is None
        ):
            typer.echo(f"broker-{index} restarted: pid {old} -> {now['pid']}, ready")
            return
        if time.monotonic() > deadline:
            raise _fail(
                f"broker-{index} not ready again within {RESTART_SECONDS:.0f} s (see {now.get('log')})"
            )
        time.sleep(0.2)  # poll interval


@dev.command("compose")
def compose_file() -> None:
    """Print deploy/compose.yaml: the same services `up` runs, in containers (3 etcd members, SeaweedFS,
    3 brokers with replication factor 3, Prometheus, Grafana)."""
    from ister.devcluster.compose import compose_yaml

    typer.echo(compose_yaml(), nl=False)
