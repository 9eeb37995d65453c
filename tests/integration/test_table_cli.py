"""`ister table` and the table commands as a user runs them, with a real broker (docs/tables.md): a
partitioned topic's printed snippets read every partition's table (one not created yet skipped), run as
printed; a NonReliable topic stores nothing, so it has no table: asking for one is refused, `ister table`
says why in one line instead of printing snippets for a table that never comes, and `topics table` /
`describe` show none (a partitioned one too)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ister.client import Client
from tests.integration.test_tables import NS, cli, publish, run_snippet, start
from tests.support import until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

NO_TABLE = "NonReliable: it stores nothing, so it has no table"


def test_a_non_reliable_topic_has_no_table_and_every_command_says_so(tmp_path: Path) -> None:
    broker = start(tmp_path)
    admin = ("--admin-addr", broker.admin_addr)
    plain, parts = f"/{NS}/volatile", f"/{NS}/spread"
    try:
        cli("admin", "namespaces", "set-table", NS, "--format", "iceberg", *admin)
        cli("admin", "topics", "create", plain, "--non-reliable", *admin)
        cli("admin", "topics", "create", parts, "--partitions", "2", "--non-reliable", *admin)
        for topic in (plain, parts):
            asked = cli("admin", "topics", "set-table", topic, "--format", "iceberg", *admin, ok=False)
            assert asked.returncode == 1, asked.stdout
            assert asked.stderr == f"error: {topic} is {NO_TABLE} (FAILED_PRECONDITION)\n"
            where = cli("table", topic, *admin, ok=False)
            assert (where.returncode, where.stdout, where.stderr) == (
                1,
                "",
                f"error: {topic} is {NO_TABLE}\n",
            )
            shown = json.loads(cli("admin", "topics", "table", topic, "-o", "json", *admin).stdout)
            assert (shown["format"], shown["format_from"], shown["tables"]) == ("iceberg", "namespace", [])
            text = cli("admin", "topics", "table", topic, *admin).stdout
            assert f"tables:          none ({NO_TABLE})" in text, text
            described = cli("admin", "topics", "describe", topic, *admin).stdout
            assert "Table:" not in described, described
            assert "table" not in json.loads(
                cli("admin", "topics", "describe", topic, "-o", "json", *admin).stdout
            )
            # turning it off (or clearing) is harmless and accepted
            cli("admin", "topics", "set-table", topic, "--format", "none", *admin)
            cli("admin", "topics", "set-table", topic, "--clear", *admin)
        # a reliable topic still gets its table
        cli("admin", "topics", "create", f"/{NS}/kept", *admin)
        kept = json.loads(cli("table", f"/{NS}/kept", "-o", "json", *admin).stdout)
        assert kept["table"] == f"{NS}.kept"
    finally:
        broker.stop()


def snippet(printed: str, engine: str) -> str:
    return printed.split(f"# {engine}\n", 1)[1].split("\n# ", 1)[0]


async def test_a_partitioned_topics_snippets_read_every_partitions_table(tmp_path: Path) -> None:
    broker = start(tmp_path)
    admin = ("--admin-addr", broker.admin_addr)
    topic = f"/{NS}/spread"
    try:
        cli("admin", "namespaces", "set-table", NS, "--format", "iceberg", "--interval", "1s", *admin)
        cli("admin", "topics", "create", topic, "--partitions", "3", *admin)
        async with Client(broker.url) as client:  # partitions 0 and 1 only: part 2 gets no table yet
            await publish(client, f"{topic}-part-0", 30)
            await publish(client, f"{topic}-part-1", 20)

        def committed() -> bool:
            listed = cli("admin", "namespaces", "tables", NS, "-o", "json", *admin, ok=False)
            # an error until the first commit creates the catalog file
            return listed.returncode == 0 and sum(t["rows"] for t in json.loads(listed.stdout)) == 50

        await until(committed, "both partitions' rows committed", 60)
        printed = cli("table", topic, *admin).stdout
        assert f"{NS}.spread-part-0, {NS}.spread-part-1, {NS}.spread-part-2" in printed
        # run as printed (the first read only partition 0's table: 30 of the topic's 50 rows)
        assert run_snippet(snippet(printed, "pyiceberg") + "\nprint(df.num_rows)") == "50"
        assert run_snippet(snippet(printed, "duckdb")) == "[(50, 29)]"
    finally:
        broker.stop()
