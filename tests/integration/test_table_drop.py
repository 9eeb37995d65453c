"""Dropping a topic's table with a real broker (docs/tables.md, "Dropping a table"): `ister admin namespaces
tables` lists the namespace's tables with their topics' state, `ister admin topics drop-table` refuses while
the topic's table policy is on, drops a deleted incarnation's `<topic>-deleted-<revision>` table keeping its
files, purges a live topic's table (policy off) with its files, and with the catalog locked fails clearly
and changes nothing."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from ister.client import Client
from tests.integration.harness import BrokerProcess
from tests.integration.test_tables import NS, cli, publish, start
from tests.integration.test_tables_ops import catalog_of
from tests.support import until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def data_files(location: str) -> list[str]:
    return sorted(str(p) for p in Path(location.removeprefix("file://")).rglob("*.parquet"))


def rows(broker: BrokerProcess, table: str) -> int:
    """The rows of the table's current snapshot, loaded afresh (-1: no such table yet)."""
    try:
        snap = catalog_of(broker).load_table((NS, table)).current_snapshot()
    except Exception:  # NoSuchTableError
        return -1
    return int(snap.summary["total-records"]) if snap is not None else 0


def listed(admin: str) -> dict[str, dict[str, object]]:
    out = json.loads(cli("admin", "namespaces", "tables", NS, "-o", "json", "--admin-addr", admin).stdout)
    return {t["table"]: t for t in out}


async def test_list_refuse_drop_and_purge_tables(tmp_path: Path) -> None:
    broker = start(tmp_path)
    admin = broker.admin_addr
    topic = f"/{NS}/churn"
    try:
        cli(
            "admin",
            "namespaces",
            "set-table",
            NS,
            "--format",
            "iceberg",
            "--interval",
            "1s",
            "--admin-addr",
            admin,
        )
        async with Client(broker.url) as client:
            await publish(client, topic, 300, "old")
            await until(lambda: rows(broker, "churn") == 300, "the first topic's rows committed", 60)
        # the policy is on: refused, naming the policy and how to turn it off
        refused = cli("admin", "topics", "drop-table", topic, "--admin-addr", admin, ok=False)
        assert refused.returncode == 1
        assert "table policy of /lake/churn is on (iceberg, from its namespace policy)" in refused.stderr
        assert "ister admin topics set-table /lake/churn --format none" in refused.stderr
        assert rows(broker, "churn") == 300

        # deleted and published to again: the old table is renamed out of the way
        cli("admin", "topics", "delete", topic, "--admin-addr", admin)
        async with Client(broker.url) as client:
            await publish(client, topic, 100, "new")
            await until(lambda: rows(broker, "churn") == 100, "the new topic's table", 60)

        def both() -> dict[str, dict[str, object]] | None:
            found = listed(admin)
            return found if len(found) == 2 and found[f"{NS}.churn"]["rows"] == 100 else None

        tables = await until(both, "the old table renamed and listed", 60)
        old = next(name for name in tables if name.startswith(f"{NS}.churn-deleted-"))
        assert tables[f"{NS}.churn"]["state"] == "policy on" and tables[f"{NS}.churn"]["rows"] == 100
        assert tables[old]["state"] == "deleted incarnation" and tables[old]["rows"] == 300
        assert tables[old]["topic"] == topic
        shown = cli("admin", "namespaces", "tables", NS, "--admin-addr", admin).stdout
        assert "TABLE" in shown and old in shown and "deleted incarnation" in shown
        old_topic = f"/{NS}/{old.split('.', 1)[1]}"
        old_files = data_files(str(tables[old]["location"]))
        assert old_files

        # the catalog locked (unavailable): a clear error, nothing dropped
        db = broker.data_dir / "tables" / "catalog.db"
        lock = sqlite3.connect(db, isolation_level=None, timeout=30)
        lock.execute("BEGIN EXCLUSIVE")
        try:
            failed = cli("admin", "topics", "drop-table", old_topic, "--admin-addr", admin, ok=False)
        finally:
            lock.execute("COMMIT")
            lock.close()
        assert failed.returncode == 1 and "the catalog at sqlite:///" in failed.stderr, failed.stderr
        assert "locked" in failed.stderr
        assert old in listed(admin)

        # a deleted incarnation's table dropped: gone from the catalog, its files kept
        dropped = json.loads(
            cli("admin", "topics", "drop-table", old_topic, "-o", "json", "--admin-addr", admin).stdout
        )
        assert dropped["purged"] is False and [d["table"] for d in dropped["dropped"]] == [old]
        assert dropped["dropped"][0]["rows"] == 300
        assert set(listed(admin)) == {f"{NS}.churn"}
        assert data_files(str(tables[old]["location"])) == old_files
        again = cli("admin", "topics", "drop-table", old_topic, "--admin-addr", admin, ok=False)
        assert again.returncode == 1 and f"no table {old}" in again.stderr

        # the live topic's, once its policy is off: purged with its files
        cli("admin", "topics", "set-table", topic, "--format", "none", "--admin-addr", admin)
        location = str(tables[f"{NS}.churn"]["location"])
        assert data_files(location)
        shown = cli("admin", "topics", "drop-table", topic, "--purge", "--admin-addr", admin).stdout
        assert f"dropped {NS}.churn (100 rows" in shown and "its files deleted" in shown
        assert listed(admin) == {}
        assert data_files(location) == []
    finally:
        broker.stop()
