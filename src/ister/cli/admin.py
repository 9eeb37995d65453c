"""`ister admin ...`: topics, namespaces and brokers through the admin gRPC API (package `danube_admin`).

Command names follow danube-admin (docs/admin.md). Every command takes `--admin-addr HOST:PORT` (env
`ISTER_ADMIN_ADDR`, default 127.0.0.1:50051) and `--output table|json`. Failures print `error: <message>` and
exit 1; usage errors exit 2. Documented in docs/admin.md.

This module holds the command groups, the options they share and the namespace commands; each command
is a spec (`admin_spec.py`) run by one runner. The topic commands are in `admin_topics.py`.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from ister.cli.admin_call import (
    ADMIN_ADDR_ENV,
    CALL_TIMEOUT_SECONDS,
    DEFAULT_ADMIN_ADDR,
    Stubs,
    admin_channel,
    call,
    call_admin,
    describe_rpc_error,
    fail,
    target_of,
    topic_name,
)
from ister.cli.admin_show import Output, emit_done, emit_fields, emit_json, emit_table
from ister.cli.admin_spec import Spec, admin_command, done, done_with, listing, rpc
from ister.cli.main import app
from ister.cli.security_opts import ApiKeyOpt, TlsCaOpt, TokenOpt, use
from ister.wire.gen import DanubeAdmin_pb2 as pb
from ister.wire.gen import ister_v1_pb2 as ister_pb

__all__ = [  # what the other admin modules use, from here
    "CALL_TIMEOUT_SECONDS",
    "DEFAULT_ADMIN_ADDR",
    "AdminAddr",
    "Output",
    "OutputOpt",
    "Stubs",
    "SubscriptionOpt",
    "TopicArg",
    "admin_app",
    "admin_channel",
    "brokers_app",
    "call",
    "call_admin",
    "describe_rpc_error",
    "emit_done",
    "emit_fields",
    "emit_json",
    "emit_table",
    "fail",
    "namespaces_app",
    "target_of",
    "topic_name",
    "topics_app",
]

admin_app = typer.Typer(
    no_args_is_help=True, add_completion=False, help="Administer brokers through the admin gRPC API."
)
topics_app = typer.Typer(no_args_is_help=True, help="Topics: list, describe, create, delete, unload, ...")
namespaces_app = typer.Typer(
    no_args_is_help=True, help="Namespaces: list, create, delete, policies, set-replication."
)
brokers_app = typer.Typer(
    no_args_is_help=True, help="Brokers: list, leader, drain, activate, balance, rebalance."
)
admin_app.add_typer(topics_app, name="topics")
admin_app.add_typer(namespaces_app, name="namespaces")
admin_app.add_typer(brokers_app, name="brokers")
app.add_typer(admin_app, name="admin")


@admin_app.callback()
def _admin_root(token: TokenOpt = None, tls_ca: TlsCaOpt = None, api_key_value: ApiKeyOpt = None) -> None:
    """Administer brokers through the admin gRPC API (`--token`/`--api-key`/`--tls-ca` before the
    subcommand)."""
    use(token, tls_ca, api_key_value)


AdminAddr = Annotated[
    str,
    typer.Option(
        "--admin-addr", envvar=ADMIN_ADDR_ENV, help="the broker's admin API, HOST:PORT (or http://HOST:PORT)"
    ),
]
OutputOpt = Annotated[Output, typer.Option("--output", "-o", help="table or json")]
TopicArg = Annotated[str, typer.Argument(help="topic name, /namespace/topic")]
SubscriptionOpt = Annotated[str, typer.Option("--subscription", "-s", help="subscription name")]
# Checked by the broker (1..5, 1..factor): one place for the rules, and its messages name the factor that
# applies when only the minimum is given.
ReplicationFactorOpt = Annotated[
    int | None,
    typer.Option("--replication-factor", help="copies of each topic in a cluster (1..5)"),
]
MinInsyncOpt = Annotated[
    int | None,
    typer.Option("--min-insync", help="in-sync copies a publish needs (1..replication factor)"),
]


def replication_fields(factor: int | None, min_insync: int | None) -> dict[str, int]:
    """The request fields for --replication-factor / --min-insync (only those given)."""
    fields = {"replication_factor": factor, "min_insync_replicas": min_insync}
    return {k: v for k, v in fields.items() if v is not None}


def with_fields(request: Any, fields: dict[str, Any]) -> Any:
    for key, value in fields.items():
        setattr(request, key, value)
    return request


NamespaceArg = Annotated[str, typer.Argument(help="namespace")]


@admin_command(namespaces_app, "list")
def namespaces_list(
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR, output: OutputOpt = Output.table
) -> Spec[Any]:
    """Every namespace."""
    return listing(
        rpc("brokers", "ListNamespaces", pb.Empty()),
        lambda r: list(r.namespaces),
        ["NAMESPACE"],
        lambda n: [n],
    )


@admin_command(namespaces_app, "topics")
def namespaces_topics(
    namespace: NamespaceArg, admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR, output: OutputOpt = Output.table
) -> Spec[Any]:
    """The topics of a namespace (names only)."""
    return listing(
        rpc("namespaces", "GetNamespaceTopics", pb.NamespaceRequest(name=namespace)),
        lambda r: [topic_name(t) for t in r.topics],
        ["TOPIC"],
        lambda n: [n],
    )


@admin_command(namespaces_app, "create")
def namespaces_create(
    namespace: NamespaceArg, admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR, output: OutputOpt = Output.table
) -> Spec[Any]:
    """Create a namespace (with the broker's default policies)."""
    request = pb.NamespaceRequest(name=namespace)
    return done(
        rpc("namespaces", "CreateNamespace", request), f"created namespace {namespace}", namespace=namespace
    )


@admin_command(namespaces_app, "delete")
def namespaces_delete(
    namespace: NamespaceArg, admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR, output: OutputOpt = Output.table
) -> Spec[Any]:
    """Delete an empty namespace."""
    request = pb.NamespaceRequest(name=namespace)
    return done(
        rpc("namespaces", "DeleteNamespace", request), f"deleted namespace {namespace}", namespace=namespace
    )


@admin_command(namespaces_app, "set-replication")
def namespaces_set_replication(
    namespace: NamespaceArg,
    replication_factor: ReplicationFactorOpt = None,
    min_insync: MinInsyncOpt = None,
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> Spec[Any]:
    """Set a namespace's replication policy (cluster mode): the copies its Reliable topics get when they
    set none themselves. A value not given stays as it is. Applies when a topic is next loaded without
    a replica record (new topics; a replicated topic keeps its replica record)."""
    if replication_factor is None and min_insync is None:
        fail("give --replication-factor, --min-insync or both")
    fields = replication_fields(replication_factor, min_insync)
    request = with_fields(ister_pb.SetNamespaceReplicationRequest(namespace=namespace), fields)

    def stored(response: Any) -> dict[str, Any]:
        return {
            f: getattr(response, f) if response.HasField(f) else None
            for f in ("replication_factor", "min_insync_replicas")
        }

    def message(response: Any) -> str:
        shown = ", ".join(
            f"{k} {'(broker default)' if v is None else v}" for k, v in stored(response).items()
        )
        return f"namespace {namespace}: {shown}"

    return done_with(
        rpc("ister_admin", "SetNamespaceReplication", request),
        message,
        lambda response: {"namespace": namespace, **stored(response)},
    )


@admin_command(namespaces_app, "policies")
def namespaces_policies(
    namespace: NamespaceArg, admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR, output: OutputOpt = Output.table
) -> Spec[Any]:
    """A namespace's policies (0 = unlimited)."""

    def policies(response: Any) -> Any:
        try:
            return json.loads(response.policies)
        except ValueError:
            fail(f"the broker sent policies that are not JSON: {response.policies[:200]!r}")

    def table(response: Any) -> None:
        shown = policies(response)
        if not isinstance(shown, dict) or not shown:
            emit_json(shown)
        else:
            emit_fields([(str(k), str(v)) for k, v in shown.items()])

    return Spec(
        rpc("namespaces", "GetNamespacePolicies", pb.NamespaceRequest(name=namespace)), table, policies
    )


# The topic commands register after the groups above and before any other module's (help lists them in
# the order they were registered).
from ister.cli import admin_topics as _admin_topics  # noqa: E402,F401
