"""`ister admin ...` through typer's CliRunner against an in-process standalone broker's admin API.

The CLI makes blocking gRPC calls, so each invocation runs in a worker thread while the event loop serves
the admin RPCs.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from typer.testing import CliRunner, Result

from ister.broker.service import BrokerService
from ister.cli.main import app
from ister.config import load_config
from ister.core.dispatch import SubType
from ister.metadata.embedded import EmbeddedStore
from ister.server.admin_api import add_admin_services


@dataclass
class Cli:
    addr: str
    broker: BrokerService

    async def __call__(self, *args: str, env: dict[str, str] | None = None, addr: bool = True) -> Result:
        argv = ["admin", *args]
        if addr:
            argv += ["--admin-addr", self.addr]
        runner = CliRunner()
        return await asyncio.to_thread(runner.invoke, app, argv, env=env)


@pytest.fixture
async def cli(tmp_path: Path) -> AsyncIterator[Cli]:
    store = EmbeddedStore.in_memory()
    broker = BrokerService(load_config(environ={}), store, tmp_path)
    await broker.start()
    server = grpc.aio.server()
    add_admin_services(server, broker)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield Cli(f"127.0.0.1:{port}", broker)
    finally:
        await server.stop(None)
        await broker.close()
        await store.close()


def ok(result: Result) -> str:
    assert result.exit_code == 0, (result.exit_code, result.stdout, result.stderr)
    return result.stdout


def failed(result: Result, code: int = 1) -> str:
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    return result.stderr


async def test_topic_lifecycle(cli: Cli) -> None:
    assert ok(await cli("topics", "create", "/default/orders", "--reliable")) == (
        "created topic /default/orders (Reliable)\n"
    )
    # the leading slash is optional; Reliable is the default
    assert ok(await cli("topics", "create", "default/events")) == "created topic /default/events (Reliable)\n"
    out = ok(
        await cli("topics", "create", "/default/p", "--partitions", "2", "--non-reliable", "--output", "json")
    )
    assert json.loads(out) == {
        "success": True,
        "topic": "/default/p",
        "partitions": 2,
        "delivery": "NonReliable",
    }
    table = ok(await cli("topics", "list", "--namespace", "default"))
    lines = table.splitlines()
    assert lines[0].split() == ["TOPIC", "BROKER", "DELIVERY"]
    assert [line.split() for line in lines[1:]] == [
        ["/default/events", "0", "Reliable"],
        ["/default/orders", "0", "Reliable"],
        ["/default/p-part-0", "0", "NonReliable"],
        ["/default/p-part-1", "0", "NonReliable"],
    ]
    by_broker = json.loads(ok(await cli("topics", "list", "--broker", "0", "-o", "json")))
    assert [t["name"] for t in by_broker] == [line.split()[0] for line in lines[1:]]
    await cli.broker.subscribe("/default/orders", "billing", "c1", SubType.SHARED, [])
    await cli.broker.subscribe("/default/orders", "audit", "c2", SubType.SHARED, [])
    described = json.loads(ok(await cli("topics", "describe", "/default/orders", "--output", "json")))
    assert described == {
        "name": "/default/orders",
        "broker_id": "0",
        "delivery": "Reliable",
        "subscriptions": ["audit", "billing"],
    }
    text = ok(await cli("topics", "describe", "/default/orders"))
    assert "Subscriptions: audit, billing" in text and "Delivery:      Reliable" in text
    part = json.loads(ok(await cli("topics", "describe", "/default/p", "-o", "json")))
    assert [p["name"] for p in part["partitions"]] == ["/default/p-part-0", "/default/p-part-1"]
    assert "PARTITION" in ok(await cli("topics", "describe", "/default/p"))
    assert ok(await cli("topics", "subscriptions", "/default/orders", "-o", "json")) == (
        json.dumps(["audit", "billing"], indent=2) + "\n"
    )
    ok(await cli("topics", "unsubscribe", "/default/orders", "-s", "audit"))
    assert ok(await cli("topics", "subscriptions", "/default/orders")).split() == ["SUBSCRIPTION", "billing"]
    assert ok(await cli("topics", "delete", "/default/p")) == "deleted topic /default/p\n"
    assert ok(await cli("topics", "unload", "/default/orders")) == "unloaded topic /default/orders\n"
    assert "/default/orders" not in cli.broker.topics


async def test_errors_exit_1_with_the_broker_message(cli: Cli) -> None:
    ok(await cli("topics", "create", "/default/t", "--non-reliable"))
    err = failed(await cli("topics", "create", "/default/t"))
    assert err.startswith("error: ") and "already exists" in err and "ALREADY_EXISTS" in err
    assert "does not exist" in failed(await cli("topics", "describe", "/default/none"))
    assert "NOT_FOUND" in failed(await cli("topics", "delete", "/nope/t"))
    assert "INVALID_ARGUMENT" in failed(await cli("topics", "create", "/default/a b"))
    assert "INVALID_ARGUMENT" in failed(await cli("topics", "list", "--broker", "x"))
    assert "FAILED_PRECONDITION" in failed(
        await cli("topics", "set-dispatch-config", "/default/t", "-s", "s", "--max-unacked-messages", "5")
    )
    # a codec and --clear together: said so (it used to read as if neither was given)
    for what in (("topics", "/default/t"), ("namespaces", "default")):
        both = failed(await cli(what[0], "set-compression", what[1], "zstd", "--clear"))
        assert both == "error: give a compression or --clear, not both\n"
        assert (
            failed(await cli(what[0], "set-compression", what[1])) == "error: give a compression or --clear\n"
        )


async def test_usage_errors_exit_2(cli: Cli) -> None:
    failed(await cli("topics", "list"), 2)
    failed(await cli("topics", "list", "--namespace", "default", "--broker", "0"), 2)
    failed(await cli("topics", "create"), 2)
    failed(await cli("topics", "list", "-n", "default", "--output", "yaml"), 2)
    failed(await cli("topics", "create", "/default/t", "--partitions", "0"), 2)
    # a limit past the API's u64: a usage error, not a traceback
    err = failed(await cli("namespaces", "set-limits", "default", "--publish-rate", str(2**64)), 2)
    assert "--publish-rate" in err and "Traceback" not in err
    failed(await cli("topics", "set-limits", "/default/t", "--dispatch-rate", str(2**64)), 2)
    failed(await cli("namespaces", "set-limits", "default", "--max-topics", str(10**20)), 2)
    result = await cli("brokers", "list", "--admin-addr", "no-port", addr=False)
    assert "--admin-addr" in failed(result, 2)


async def test_unreachable_admin_api(cli: Cli) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        result = await cli("brokers", "list", "--admin-addr", f"127.0.0.1:{port}", addr=False)
    err = failed(result)
    assert err.startswith(f"error: cannot reach the admin API at 127.0.0.1:{port}")
    assert "ISTER_ADMIN_ADDR" in err


async def test_admin_addr_from_the_environment(cli: Cli) -> None:
    result = await cli("brokers", "leader", env={"ISTER_ADMIN_ADDR": f"http://{cli.addr}"}, addr=False)
    assert ok(result) == "0\n"


async def test_namespaces_and_brokers(cli: Cli) -> None:
    assert ok(await cli("namespaces", "create", "team")) == "created namespace team\n"
    assert "ALREADY_EXISTS" in failed(await cli("namespaces", "create", "team"))
    assert json.loads(ok(await cli("namespaces", "list", "-o", "json"))) == ["default", "team"]
    ok(await cli("topics", "create", "/team/t"))
    assert json.loads(ok(await cli("namespaces", "topics", "team", "-o", "json"))) == ["/team/t"]
    policies = json.loads(ok(await cli("namespaces", "policies", "team", "-o", "json")))
    assert policies["max_consumers_per_topic"] == 0
    assert "max_message_size:" in ok(await cli("namespaces", "policies", "team"))
    assert "FAILED_PRECONDITION" in failed(await cli("namespaces", "delete", "team"))
    ok(await cli("topics", "delete", "/team/t"))
    ok(await cli("namespaces", "delete", "team"))
    assert ok(await cli("namespaces", "list")).split() == ["NAMESPACE", "default"]
    brokers = json.loads(ok(await cli("brokers", "list", "-o", "json")))
    assert brokers == [
        {
            "broker_id": "0",
            "broker_addr": "http://127.0.0.1:6650",
            "admin_addr": "http://127.0.0.1:50051",
            "metrics_addr": "127.0.0.1:9040",
            "broker_role": "Cluster_Leader",
            "broker_status": "active",
        }
    ]
    assert ok(await cli("brokers", "list")).splitlines()[0].split() == [
        "ID",
        "ADDRESS",
        "ADMIN",
        "METRICS",
        "ROLE",
        "STATUS",
    ]
    assert json.loads(ok(await cli("brokers", "leader", "-o", "json"))) == {"leader": "0"}


async def test_subscription_policies(cli: Cli) -> None:
    ok(await cli("topics", "create", "/default/r", "--reliable"))
    await cli.broker.subscribe("/default/r", "s", "c", SubType.KEY_SHARED, [])
    base = ["/default/r", "-s", "s"]
    unset = json.loads(ok(await cli("topics", "get-failure-policy", *base, "-o", "json")))
    assert unset == {"subscription_type": 3, "failure_policy": None}
    args = [
        "--max-redelivery-count",
        "4",
        "--ack-timeout-ms",
        "2000",
        "--base-redelivery-delay-ms",
        "10",
        "--max-redelivery-delay-ms",
        "500",
    ]
    assert "INVALID_ARGUMENT" in failed(
        await cli("topics", "set-failure-policy", *base, *args, "--poison-policy", "dead_letter")
    )
    ok(
        await cli(
            "topics",
            "set-failure-policy",
            *base,
            *args,
            "--poison-policy",
            "dead_letter",
            "--dead-letter-topic",
            "/default/r-dlq",
            "--backoff-strategy",
            "exponential",
        )
    )
    got = json.loads(ok(await cli("topics", "get-failure-policy", *base, "-o", "json")))
    assert got["failure_policy"] == {
        "max_redelivery_count": 4,
        "ack_timeout_ms": 2000,
        "base_redelivery_delay_ms": 10,
        "max_redelivery_delay_ms": 500,
        "backoff_strategy": "Exponential",
        "dead_letter_topic": "/default/r-dlq",
        "poison_policy": "DeadLetter",
    }
    assert "poison_policy" in ok(await cli("topics", "get-failure-policy", *base))
    assert json.loads(ok(await cli("topics", "get-dispatch-config", *base, "-o", "json"))) == {
        "max_unacked_messages": None,
        "rebalance_delay_seconds": None,
        "max_handoff_seconds": None,
    }
    assert "INVALID_ARGUMENT" in failed(
        await cli("topics", "set-dispatch-config", *base, "--max-unacked-messages", "0")
    )
    ok(await cli("topics", "set-dispatch-config", *base, "--max-unacked-messages", "64"))
    ok(await cli("topics", "set-dispatch-config", *base, "--max-handoff", "0.5"))  # the window stays
    shown = ok(await cli("topics", "get-dispatch-config", *base, "-o", "json"))
    assert json.loads(shown) == {
        "max_unacked_messages": 64,
        "rebalance_delay_seconds": None,
        "max_handoff_seconds": 0.5,
    }
    assert "INVALID_ARGUMENT" in failed(
        await cli("topics", "set-dispatch-config", *base, "--max-handoff", "4000")
    )
