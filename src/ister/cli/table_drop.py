"""`ister admin topics drop-table TOPIC [--purge]` and `ister admin namespaces tables NS` (docs/tables.md,
"Dropping a table"): a topic's tables (a deleted topic's, `<topic>-deleted-<revision>` ones) listed and
dropped in the catalog the broker names. The broker says where the catalog is and whether the topic's
table policy is on; the pyiceberg calls run here (tables/drop.py), with the broker's reader properties and
any `--property` given (secrets the broker does not send)."""

from __future__ import annotations

from typing import Annotated, Any

import grpc
import typer

from ister.cli.admin import (
    DEFAULT_ADMIN_ADDR,
    AdminAddr,
    Output,
    OutputOpt,
    TopicArg,
    call,
    emit_json,
    emit_table,
    fail,
    namespaces_app,
    topic_name,
    topics_app,
)
from ister.errors import InvalidArgument, NotFound
from ister.ids import TopicName, counted
from ister.tables.catalog import CatalogSpec
from ister.wire.gen import ister_v1_pb2 as ister_pb

PropertyOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--property", help="KEY=VALUE: a catalog property to add (a secret the broker does not send)"
    ),
]


def _spec(r: ister_pb.TablePolicyResponse, given: list[str] | None) -> CatalogSpec:
    props = dict(r.properties)
    for item in given or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail(f"--property {item!r}: expected KEY=VALUE")
        props[key] = value
    return CatalogSpec(r.catalog_uri, props.pop("warehouse", ""), props)


def _topic_policy(s: Any, name: str) -> ister_pb.TablePolicyResponse | None:
    """The topic's table policy in effect; None when the topic does not exist (deleted)."""
    try:
        r: ister_pb.TablePolicyResponse = s.ister_admin.GetTablePolicy(
            ister_pb.GetTablePolicyRequest(topic=name), timeout=30.0
        )
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.NOT_FOUND:
            return None
        raise
    return r


def _ask(s: Any, name: TopicName) -> tuple[ister_pb.TablePolicyResponse, ister_pb.TablePolicyResponse | None]:
    ns = s.ister_admin.GetTablePolicy(ister_pb.GetTablePolicyRequest(namespace=name.namespace), timeout=30.0)
    return ns, _topic_policy(s, name.full)


def _catalog_failed(uri: str, exc: BaseException, after: str = "") -> str:
    """One line (SQL errors carry the statement and a link on lines of their own)."""
    first = next(iter(str(exc).strip().splitlines()), "")
    return f"the catalog at {uri} failed: {type(exc).__name__}: {first}{after}"


@topics_app.command("drop-table")
def topics_drop_table(
    topic: TopicArg,
    purge: Annotated[
        bool, typer.Option("--purge", help="delete the table's data and metadata files too (purge_table)")
    ] = False,
    properties: PropertyOpt = None,
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> None:
    """Drop a topic's table from the catalog (each partition's): a deleted topic's, or a renamed
    `<topic>-deleted-<revision>` one. Refused while the topic's table policy is on. The files stay unless
    --purge."""
    from ister.tables.drop import DropFailed, drop, open_existing

    try:
        name = TopicName.parse(topic_name(topic))
    except InvalidArgument as exc:
        fail(str(exc))
    ns_policy, policy = call(admin_addr, lambda s: _ask(s, name))
    # a NonReliable topic has no tables (and no committer), whatever its policy: an older incarnation's
    # table under its name can still be dropped
    if policy is not None and policy.format == "iceberg" and policy.tables:
        whole = f"`ister admin namespaces set-table {name.namespace} --format none`"
        fail(
            f"the table policy of {name.full} is on (iceberg, from its {policy.format_source} policy): its "
            f"broker keeps committing to the table. Turn it off first with `ister admin topics set-table "
            f"{name.full} --format none`" + (f" (or {whole})" if policy.format_source == "namespace" else "")
        )
    tables = (
        list(policy.tables) if policy is not None and policy.tables else [f"{name.namespace}.{name.topic}"]
    )
    idents = [(t.split(".", 1)[0], t.split(".", 1)[1]) for t in tables]
    spec = _spec(ns_policy, properties)
    try:
        dropped = drop(open_existing(spec), idents, purge)
    except (NotFound, InvalidArgument) as exc:
        fail(f"{exc}; nothing was dropped")
    except DropFailed as exc:
        before = ", ".join(d.table for d in exc.done)
        fail(
            _catalog_failed(
                spec.uri, exc.cause, f"; dropped before it: {before}" if before else "; nothing was dropped"
            )
        )
    except Exception as exc:  # the catalog's own (unreachable, locked, refused): pyiceberg, SQL, HTTP
        fail(_catalog_failed(spec.uri, exc, "; nothing was dropped"))
    if output == Output.json:
        emit_json(
            {
                "dropped": [
                    {"table": d.table, "rows": d.rows, "files": d.files, "location": d.location}
                    for d in dropped
                ],
                "purged": purge,
            }
        )
        return
    for d in dropped:
        done = "its files deleted" if purge else f"its files kept at {d.location}"
        typer.echo(dropped_line(d.table, d.rows, d.files, done))


def dropped_line(table: str, rows: int | None, files: int | None, done: str) -> str:
    """One dropped table, for people; None: the catalog did not say."""
    shown_rows = counted(rows, "row") if rows is not None else "? rows"
    shown_files = counted(files, "file") if files is not None else "? files"
    return f"dropped {table} ({shown_rows}, {shown_files}; {done})"


@namespaces_app.command("tables")
def namespaces_tables(
    namespace: Annotated[str, typer.Argument(help="namespace")],
    properties: PropertyOpt = None,
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> None:
    """The namespace's tables in the catalog, with the topic each keeps: live (policy on or off), deleted,
    or a deleted incarnation's renamed table (`<topic>-deleted-<revision>`)."""
    from ister.tables.drop import list_tables, open_existing

    r = call(
        admin_addr,
        lambda s: s.ister_admin.GetTablePolicy(
            ister_pb.GetTablePolicyRequest(namespace=namespace), timeout=30.0
        ),
    )
    spec = _spec(r, properties)
    try:
        found = list_tables(open_existing(spec), namespace)
    except NotFound as exc:
        fail(str(exc))
    except Exception as exc:  # the catalog's own (unreachable, locked, refused)
        fail(_catalog_failed(spec.uri, exc))

    def states(s: Any) -> list[str]:
        out = []
        for t in found:
            if t.retired_from is not None:
                out.append("deleted incarnation")
                continue
            policy = _topic_policy(s, f"/{t.table.replace('.', '/', 1)}")
            on = policy is not None and policy.format == "iceberg"
            out.append("topic deleted" if policy is None else f"policy {'on' if on else 'off'}")
        return out

    state = call(admin_addr, states)
    if output == Output.json:
        emit_json(
            [
                {
                    "table": t.table,
                    "topic": f"/{namespace}/{t.retired_from or t.table.split('.', 1)[1]}",
                    "state": st,
                    "rows": t.rows,
                    "files": t.files,
                    "location": t.location,
                }
                for t, st in zip(found, state, strict=True)
            ]
        )
        return
    if not found:
        typer.echo(f"no tables in namespace {namespace}")
        return
    emit_table(
        ["TABLE", "STATE", "ROWS", "FILES", "LOCATION"],
        [
            [t.table, st, "-" if t.rows is None else t.rows, "-" if t.files is None else t.files, t.location]
            for t, st in zip(found, state, strict=True)
        ],
    )
