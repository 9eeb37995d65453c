"""Topics as Iceberg tables (docs/tables.md): `ister admin namespaces set-table|table`, `ister admin
topics set-table|table`, and `ister table TOPIC` (where a topic's table is and how each engine reads it)."""

from __future__ import annotations

import json
from typing import Annotated, Any

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
from ister.cli.main import app
from ister.cli.security_opts import ApiKeyOpt, TlsCaOpt, TokenOpt, use
from ister.core.retention import format_duration_ms
from ister.errors import InvalidArgument
from ister.tables.catalog import CATALOG_NAME
from ister.tables.policy import parse_setting
from ister.wire.gen import ister_v1_pb2 as ister_pb

FormatOpt = Annotated[
    str | None, typer.Option("--format", help="iceberg: keep the topic as an Iceberg table; none: stop")
]
PartitionOpt = Annotated[
    str | None, typer.Option("--partition", help="partition the table by publish day or hour: day|hour")
]
IntervalOpt = Annotated[
    str | None,
    typer.Option("--interval", help="how often the unexported tail is committed: 10s (1s .. 1d)"),
]


def _request(
    fmt: str | None, partition: str | None, interval: str | None, **target: Any
) -> ister_pb.SetTablePolicyRequest:
    try:
        setting = parse_setting(fmt, partition, interval)
    except InvalidArgument as exc:
        fail(str(exc))
    request = ister_pb.SetTablePolicyRequest(
        format=setting.format or "", partition=setting.partition or "", **target
    )
    if setting.interval_ms is not None:
        request.interval_ms = setting.interval_ms
    return request


NO_TABLE = "NonReliable: it stores nothing, so it has no table"


def _policy_json(what: str, r: ister_pb.TablePolicyResponse, topic: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": what,
        "format": r.format,
        "partition": r.partition,
        "interval_ms": r.interval_ms,
        "format_from": r.format_source,
        "partition_from": r.partition_source,
        "interval_from": r.interval_source,
        "catalog_uri": r.catalog_uri,
    }
    if topic:
        out["tables"] = list(r.tables)  # [] for a NonReliable topic
    return out


def _emit_policy(output: Output, what: str, r: ister_pb.TablePolicyResponse, topic: bool = False) -> None:
    if output == Output.json:
        emit_json(_policy_json(what, r, topic))
        return
    rows = [
        ("name", what),
        ("table format", f"{r.format} ({r.format_source})"),
        ("partitioned by", f"publish {r.partition} ({r.partition_source})"),
        ("commit interval", f"{format_duration_ms(r.interval_ms)} ({r.interval_source})"),
        ("catalog", r.catalog_uri),
    ]
    if topic:
        rows.append(("tables", ", ".join(r.tables) or f"none ({NO_TABLE})"))
    emit_fields(rows)


@namespaces_app.command("set-table")
def namespaces_set_table(
    namespace: Annotated[str, typer.Argument(help="namespace")],
    fmt: FormatOpt = None,
    partition: PartitionOpt = None,
    interval: IntervalOpt = None,
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> None:
    """Keep every reliable topic of a namespace as an Iceberg table (its topics' own setting overrides
    this). Off by default; a field not given stays as it is."""
    request = _request(fmt, partition, interval, namespace=namespace)
    r = call(admin_addr, lambda s: s.ister_admin.SetTablePolicy(request, timeout=30.0))
    _emit_policy(output, namespace, r)


@namespaces_app.command("table")
def namespaces_table(
    namespace: Annotated[str, typer.Argument(help="namespace")],
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> None:
    """A namespace's table policy and the catalog."""
    request = ister_pb.GetTablePolicyRequest(namespace=namespace)
    r = call(admin_addr, lambda s: s.ister_admin.GetTablePolicy(request, timeout=30.0))
    _emit_policy(output, namespace, r)


@topics_app.command("set-table")
def topics_set_table(
    topic: TopicArg,
    fmt: FormatOpt = None,
    partition: PartitionOpt = None,
    interval: IntervalOpt = None,
    clear: Annotated[bool, typer.Option("--clear", help="drop the topic's own setting")] = False,
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> None:
    """Set a topic's own table policy (every partition of a partitioned topic), overriding its
    namespace's; `--clear` goes back to the namespace's."""
    name = topic_name(topic)
    if clear:
        if fmt is not None or partition is not None or interval is not None:
            fail("give --format/--partition/--interval or --clear, not both")
        request = ister_pb.SetTablePolicyRequest(topic=name, clear=True)
    else:
        request = _request(fmt, partition, interval, topic=name)
    r = call(admin_addr, lambda s: s.ister_admin.SetTablePolicy(request, timeout=30.0))
    _emit_policy(output, name, r, topic=True)


@topics_app.command("table")
def topics_table(
    topic: TopicArg, admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR, output: OutputOpt = Output.table
) -> None:
    """A topic's table policy in effect and where each field comes from."""
    name = topic_name(topic)
    request = ister_pb.GetTablePolicyRequest(topic=name)
    r = call(admin_addr, lambda s: s.ister_admin.GetTablePolicy(request, timeout=30.0))
    _emit_policy(output, name, r, topic=True)


ICEBERG_SPARK = "org.apache.iceberg:iceberg-spark-runtime-4.0_2.13:1.10.0"
# Iceberg's JdbcCatalog opens the database through DriverManager: the driver must be on the classpath too
JDBC_DRIVERS = {"sqlite": "org.xerial:sqlite-jdbc:3.46.1.3", "postgresql": "org.postgresql:postgresql:42.7.4"}


def _spark_packages(uri: str) -> str:
    if uri.startswith("http"):
        return ICEBERG_SPARK
    return f"{ICEBERG_SPARK},{JDBC_DRIVERS['sqlite' if uri.startswith('sqlite') else 'postgresql']}"


def _jdbc(uri: str) -> str:
    """The JDBC URL of a SQL catalog's URI (Iceberg's JdbcCatalog keeps tables in the same layout)."""
    if uri.startswith("sqlite:///"):
        return "jdbc:sqlite:/" + uri.removeprefix("sqlite:///").lstrip("/")
    return "jdbc:postgresql://" + uri.split("://", 1)[1].rsplit("@", 1)[-1]  # credentials go in jdbc.user


def _jdbc_user(uri: str) -> str:
    """A PostgreSQL catalog's user, and its password from PGPASSWORD (the URI the broker prints has none)."""
    userinfo = uri.split("://", 1)[1].rsplit("@", 1)
    if not uri.startswith("postgresql") or len(userinfo) == 1:
        return ""
    return (
        f'  .config("spark.sql.catalog.ister.jdbc.user", "{userinfo[0].split(":", 1)[0]}")\n'
        '  .config("spark.sql.catalog.ister.jdbc.password", os.environ.get("PGPASSWORD", ""))\n'
    )


def snippets(catalog_uri: str, tables: list[str], properties: dict[str, str]) -> dict[str, str]:
    """Ready-to-run code reading the topic's tables with pyiceberg, DuckDB and Spark. A partitioned topic
    has one table per partition: the code reads them all, skipping a partition whose table is not created
    yet (a table is created at its first committed record)."""
    props = {"uri": catalog_uri, **properties}
    kwargs = ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in props.items())
    catalog = f'catalog = load_catalog("ister", **{{{kwargs}}})\n'
    if catalog_uri.startswith("postgresql"):  # the broker prints no password
        catalog = catalog[:-1] + "  # the password: PGPASSWORD or ~/.pgpass (libpq reads them)\n"
    count = 'print(con.sql("select count(*), max(\\"offset\\") from t").fetchall())'
    if len(tables) == 1:
        load = (
            "from pyiceberg.catalog import load_catalog\n"
            + catalog
            + f'table = catalog.load_table("{tables[0]}")  # created at the first committed record\n'
        )
        pyiceberg = load + "df = table.scan().to_arrow()  # .to_pandas(), .to_polars(): with pandas, polars"
        duckdb = load + (
            "import duckdb\n"
            'con = table.scan().to_duckdb(table_name="t")  # or: INSTALL iceberg; iceberg_scan(metadata)\n'
            + count
        )
    else:
        pyiceberg = (
            "import pyarrow as pa\n"
            "from pyiceberg.catalog import load_catalog\n"
            + catalog
            + f"names = {json.dumps(tables)}  # one table per partition\n"
            "tables = [catalog.load_table(n) for n in names if catalog.table_exists(n)]\n"
            'df = pa.concat_tables([t.scan().to_arrow() for t in tables], promote_options="default")'
        )
        duckdb = pyiceberg + '\nimport duckdb\ncon = duckdb.connect()\ncon.register("t", df)\n' + count
    names = [f"ister.`{t.split('.', 1)[0]}`.`{t.split('.', 1)[1]}`" for t in tables]
    read = (
        f'spark.table("{names[0]}").show()'
        if len(names) == 1
        else "from functools import reduce\n"
        f"parts = [spark.table(n) for n in {json.dumps(names)} if spark.catalog.tableExists(n)]\n"
        "reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), parts).show()"
    )
    spark = (
        ("import os\n" if _jdbc_user(catalog_uri) else "") + "spark = (SparkSession.builder\n"
        f'  .config("spark.jars.packages", "{_spark_packages(catalog_uri)}")\n'
        '  .config("spark.sql.catalog.ister", "org.apache.iceberg.spark.SparkCatalog")\n'
        + (
            '  .config("spark.sql.catalog.ister.type", "rest")\n'
            f'  .config("spark.sql.catalog.ister.uri", "{catalog_uri}")\n'
            if catalog_uri.startswith("http")
            else '  .config("spark.sql.catalog.ister.catalog-impl", "org.apache.iceberg.jdbc.JdbcCatalog")\n'
            f'  .config("spark.sql.catalog.ister.uri", "{_jdbc(catalog_uri)}")\n' + _jdbc_user(catalog_uri)
        )
        + f'  .config("spark.sql.catalog.ister.warehouse", "{properties.get("warehouse", "")}")\n'
        "  .getOrCreate())\n" + read
    )
    return {"pyiceberg": pyiceberg, "duckdb": duckdb, "spark": spark}


@app.command("table")
def table_command(
    topic: TopicArg,
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
    token: TokenOpt = None,
    tls_ca: TlsCaOpt = None,
    api_key_value: ApiKeyOpt = None,
) -> None:
    """Where a topic's Iceberg table is: the catalog URI, the table name (one per partition) and a ready
    snippet for pyiceberg, DuckDB and Spark. `-o json`: {"catalog_uri": ..., "table": ...}."""
    use(token, tls_ca, api_key_value)
    name = topic_name(topic)
    request = ister_pb.GetTablePolicyRequest(topic=name)
    r = call(admin_addr, lambda s: s.ister_admin.GetTablePolicy(request, timeout=30.0))
    if not r.tables:
        fail(f"{name} is {NO_TABLE}")
    if r.format != "iceberg":
        fail(f"{name} is not kept as a table: `ister admin topics set-table {name} --format iceberg`")
    tables, props = list(r.tables), dict(r.properties)
    if output == Output.json:
        out: dict[str, Any] = {
            "catalog_uri": r.catalog_uri,
            "table": tables[0] if len(tables) == 1 else tables,
        }
        # SQL catalogs keep tables per catalog name: readers load it as "ister"
        emit_json({**out, "catalog_name": CATALOG_NAME, "properties": props})
        return
    emit_fields(
        [("catalog_uri", r.catalog_uri), ("catalog_name", CATALOG_NAME), ("table", ", ".join(tables))]
    )
    for engine, code in snippets(r.catalog_uri, tables, props).items():
        typer.echo(f"\n# {engine}\n{code}")
