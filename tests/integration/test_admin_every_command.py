"""Every `ister admin ...` command, enumerated from the typer app, against a real standalone broker and a
real 3-broker cluster: none ends in a traceback. Each ends with exit code 0, or 1 with one line
`error: ...` on stderr (a command that does not apply in a mode says why in that line). Read commands run
again with `-o json`, which must parse, with every id a string (u64 ids lose digits as JSON numbers).

A command added to the app without a case here fails `test_every_command_has_a_case`.
"""

from __future__ import annotations

import asyncio
import functools
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import typer.main
import typer.testing
from typer.testing import CliRunner, Result

from ister.cli.main import app
from tests.etcd_server import EtcdServer
from tests.integration.cluster import Cluster
from tests.integration.harness import BrokerProcess

pytestmark = pytest.mark.integration

SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}}}


@dataclass(frozen=True)
class Case:
    args: tuple[str, ...]
    read_only: bool = False  # also run with -o json, and again (no side effect to repeat)


@functools.cache
def ister_command() -> Any:
    """The app's click command, built once: typer builds the whole tree anew each time it is asked (~70 ms
    here), and `CliRunner.invoke` asks on every call."""
    return typer.main.get_command(app)


def admin_commands() -> set[tuple[str, ...]]:
    """The path of every leaf command under `ister admin`."""
    found: set[tuple[str, ...]] = set()

    def walk(command: Any, path: tuple[str, ...]) -> None:
        subs = getattr(command, "commands", None)
        if subs:
            for name, sub in subs.items():
                walk(sub, (*path, name))
        else:
            found.add(path)

    walk(ister_command().commands["admin"], ())
    return found


def has_output_option(path: tuple[str, ...]) -> bool:
    command: Any = ister_command().commands["admin"]
    for name in path:
        command = command.commands[name]
    return any(p.name == "output" for p in command.params)


def cases(broker_id: str, other_id: str, schema_file: Path) -> list[Case]:
    """In order: what a later command needs exists by then (a namespace, a topic, a subject, a role)."""
    ns = "every" + uuid.uuid4().hex[:8]
    t, p, sub, subject, role = f"/{ns}/t", f"/{ns}/p", "s1", f"{ns}-subject", f"{ns}-role"
    schema = ("-f", str(schema_file))
    policy = ("--max-redelivery-count", "3", "--ack-timeout-ms", "1000", "--base-redelivery-delay-ms")
    policy += ("100", "--max-redelivery-delay-ms", "1000", "--poison-policy", "drop")
    return [
        Case(("namespaces", "create", ns)),
        Case(("namespaces", "list"), True),
        Case(("namespaces", "topics", ns), True),
        Case(("namespaces", "policies", ns), True),
        Case(("namespaces", "set-replication", ns, "--min-insync", "1")),
        Case(("namespaces", "set-retention", ns, "--time", "7d")),
        Case(("namespaces", "retention", ns), True),
        Case(("namespaces", "set-table", ns, "--partition", "hour")),
        Case(("namespaces", "table", ns), True),
        Case(("namespaces", "tables", ns), True),  # the catalog's tables (none, or no catalog yet: an error)
        Case(("namespaces", "set-backlog-quota", ns, "--size", "1GiB")),
        Case(("namespaces", "set-message-ttl", ns, "1d")),
        Case(("namespaces", "set-limits", ns, "--publish-rate", "1000", "--max-topics", "100")),
        Case(("namespaces", "limits", ns), True),
        Case(("namespaces", "set-compression", ns, "lz4")),
        Case(("namespaces", "compression", ns), True),
        Case(("topics", "create", t, "--reliable")),
        Case(("topics", "create", p, "--partitions", "2")),
        Case(("topics", "list", "--namespace", ns), True),
        Case(("topics", "list", "--broker", broker_id), True),
        Case(("topics", "describe", t), True),
        Case(("topics", "describe", p), True),
        Case(("topics", "subscriptions", t), True),
        Case(("topics", "set-failure-policy", t, "-s", sub, *policy)),
        Case(("topics", "get-failure-policy", t, "-s", sub), True),
        Case(("topics", "set-dispatch-config", t, "-s", sub, "--max-unacked-messages", "5")),
        Case(("topics", "get-dispatch-config", t, "-s", sub), True),
        Case(("topics", "set-retention", t, "--time", "1d")),
        Case(("topics", "retention", t), True),
        Case(("topics", "set-table", t, "--interval", "30s")),
        Case(("topics", "table", t), True),
        Case(("topics", "drop-table", t)),  # no table to drop: an error line
        Case(("topics", "set-limits", t, "--publish-rate-bytes", "1000000")),
        Case(("topics", "limits", t), True),
        Case(("topics", "set-compression", t, "zstd")),
        Case(("topics", "compression", t), True),
        Case(("topics", "stats", t), True),
        Case(("subscriptions", "list", "--namespace", ns), True),
        Case(("topics", "peek", t), True),
        Case(("topics", "reset-cursor", t, "-s", sub, "--to", "earliest")),
        Case(("topics", "recover", t)),  # refused: standalone, or a healthy (here single-copy) topic
        Case(("topics", "unload", t)),
        Case(("topics", "unsubscribe", t, "-s", sub)),
        Case(("schemas", "register", subject, *schema)),
        Case(("schemas", "get", subject), True),
        Case(("schemas", "versions", subject), True),
        Case(("schemas", "check", subject, *schema), True),
        Case(("schemas", "mode", subject, "backward")),
        Case(("schemas", "list"), True),
        Case(("schemas", "delete", subject, "--version", "1")),
        Case(("security", "tokens", "create", "--principal", "alice")),
        Case(("security", "api-keys", "create", "--principal", "alice")),
        Case(("security", "api-keys", "list"), True),
        Case(("security", "api-keys", "revoke", "no-such-key")),
        Case(("security", "roles", "create", role, "--permissions", "Produce,Lookup")),
        Case(("security", "roles", "get", role), True),
        Case(("security", "roles", "list"), True),
        Case(("security", "bindings", "create", f"{ns}-b", "--principal-name", "bob", "--roles", role)),
        Case(("security", "bindings", "get", f"{ns}-b"), True),
        Case(("security", "bindings", "list"), True),
        Case(("security", "bindings", "delete", f"{ns}-b")),
        Case(("security", "roles", "delete", role)),
        Case(("brokers", "list"), True),
        Case(("brokers", "leader"), True),
        Case(("brokers", "balance"), True),
        Case(("brokers", "load"), True),
        Case(("brokers", "rebalance", "--dry-run"), True),
        Case(("cluster", "health"), True),
        Case(("brokers", "rebalance", "--execute")),
        Case(("brokers", "drain", other_id, "--dry-run"), True),
        Case(("brokers", "drain", other_id, "--wait", "--timeout", "60")),
        Case(("brokers", "activate", other_id)),
        Case(("topics", "delete", t)),
        Case(("topics", "delete", p)),
        Case(("namespaces", "delete", ns)),
    ]


def test_every_command_has_a_case(tmp_path: Path) -> None:
    covered = {c.args[: len(path)] for c in cases("0", "0", tmp_path) for path in admin_commands()}
    missing = sorted(" ".join(path) for path in admin_commands() if path not in covered)
    assert not missing, f"admin commands without a case in this test: {missing}"


def invoke(args: list[str]) -> Result:
    with mock.patch.object(typer.testing, "_get_command", lambda _: ister_command()):
        return CliRunner().invoke(app, ["admin", *args])


def check_ends_cleanly(args: list[str], result: Result) -> None:
    shown = f"ister admin {' '.join(args)}: exit {result.exit_code}\n{result.stdout}\n{result.stderr}"
    crashed = result.exception is not None and not isinstance(result.exception, SystemExit)
    assert not crashed, f"{shown}\n{result.exception!r}"
    assert "Traceback" not in result.stdout + result.stderr, shown
    assert result.exit_code in (0, 1), shown
    if result.exit_code == 1:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), shown


def ids_are_strings(value: Any, where: str = "$") -> None:
    """No JSON number under a key that names an id (or a move's brokers)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key.endswith("_id") or key in ("id", "from", "to", "leader"):
                assert not isinstance(item, int | float), f"{where}.{key} is the number {item}"
            ids_are_strings(item, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            ids_are_strings(item, f"{where}[{i}]")


async def run_every_command(admin_addr: str, broker_id: str, other_id: str, tmp_path: Path) -> list[str]:
    """Run every case; the commands that answered an error (for the test to look at)."""
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(SCHEMA))
    refused = []
    for case in cases(broker_id, other_id, schema_file):
        args = [*case.args, "--admin-addr", admin_addr]
        result = await asyncio.to_thread(invoke, args)
        check_ends_cleanly(args, result)
        if result.exit_code:
            refused.append(f"{' '.join(case.args)} -> {result.stderr.strip()}")
        if case.read_only and has_output_option(case.args[: 3 if case.args[0] == "security" else 2]):
            result = await asyncio.to_thread(invoke, [*args, "-o", "json"])
            check_ends_cleanly([*args, "-o", "json"], result)
            if result.exit_code == 0:
                ids_are_strings(json.loads(result.stdout))
    return refused


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(tmp_path / "data")
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture
async def three(tmp_path: Path, etcd_server: EtcdServer) -> AsyncIterator[Cluster]:
    cluster = Cluster(tmp_path, etcd_server.endpoint, 3)
    await cluster.start()
    await cluster.until(cluster.leader, "a leader")
    try:
        yield cluster
    finally:
        await cluster.stop()


async def test_every_admin_command_on_a_standalone_broker(standalone: BrokerProcess, tmp_path: Path) -> None:
    refused = await run_every_command(standalone.admin_addr, "0", "0", tmp_path)
    print("\n".join(refused))
    # Cluster-only commands say why in their one line.
    for command in ("brokers balance", "brokers load", "brokers drain", "brokers activate", "topics recover"):
        line = next(r for r in refused if r.startswith(command))
        assert "standalone" in line and "FAILED_PRECONDITION" in line, line


async def test_every_admin_command_on_a_cluster(three: Cluster, tmp_path: Path) -> None:
    first, second = three.brokers[0], three.brokers[1]
    refused = await run_every_command(
        first.admin_addr, str(three.broker_id(first)), str(three.broker_id(second)), tmp_path
    )
    print("\n".join(refused))
    # What works only in a cluster works there.
    for command in ("brokers balance", "brokers load", "brokers drain", "brokers activate"):
        assert not any(r.startswith(command) for r in refused), refused
    line = next(r for r in refused if r.startswith("topics recover"))
    assert "NOT_FOUND" in line and "not replicated" in line, line
    # Tables need one catalog every broker shares: without tables.catalog_uri (each broker's own SQLite
    # file), turning them on is refused in one line saying what to set.
    for args in (
        ["namespaces", "set-table", "default", "--format", "iceberg"],
        ["topics", "create", "/default/shared-catalog"],
        ["topics", "set-table", "/default/shared-catalog", "--format", "iceberg"],
    ):
        result = await asyncio.to_thread(invoke, [*args, "--admin-addr", first.admin_addr])
        check_ends_cleanly(args, result)
        if args[1] == "set-table":
            assert result.exit_code == 1 and "FAILED_PRECONDITION" in result.stderr, result.stderr
            assert "set tables.catalog_uri" in result.stderr and "every broker" in result.stderr
