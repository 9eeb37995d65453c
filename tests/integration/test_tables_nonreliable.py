"""A NonReliable topic stores nothing, so it has no table (docs/tables.md, "Policy"): with a real broker,
asking for one is refused, `ister table` says why in one line instead of printing snippets for a table
that never comes, and `topics table` / `describe` show none (a partitioned one too)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.test_tables import NS, cli, start

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
