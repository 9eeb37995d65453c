"""Listing and dropping topics' tables (ister.tables.drop, docs/tables.md "Dropping a table") on a real
SQLite catalog: a missing table drops none, a catalog that fails midway says what it dropped before, purge
deletes the files, a missing catalog file is not created."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from ister.errors import NotFound
from ister.tables.catalog import CatalogSpec, open_catalog
from ister.tables.drop import DropFailed, drop, list_tables, open_existing


def spec(tmp_path: Path) -> CatalogSpec:
    return CatalogSpec(f"sqlite:///{tmp_path / 'catalog.db'}", (tmp_path / "warehouse").as_uri())


def with_tables(tmp_path: Path, *names: str) -> Any:
    catalog = open_catalog(spec(tmp_path))
    catalog.create_namespace("lake")
    for name in names:
        table = catalog.create_table(("lake", name), pa.schema([("offset", pa.int64())]))
        table.append(pa.table({"offset": pa.array(range(10), pa.int64())}))
    return catalog


def files_under(tmp_path: Path) -> list[Path]:
    return [p for p in (tmp_path / "warehouse").rglob("*") if p.is_file()]


def test_a_missing_catalog_file_is_an_error_not_a_new_catalog(tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="does not exist here"):
        open_existing(spec(tmp_path))
    assert not (tmp_path / "catalog.db").exists()


def test_list_then_drop_keeping_files_then_purge(tmp_path: Path) -> None:
    with_tables(tmp_path, "events", "churn-deleted-42")
    catalog = open_existing(spec(tmp_path))
    found = {t.table: t for t in list_tables(catalog, "lake")}
    assert set(found) == {"lake.events", "lake.churn-deleted-42"}
    assert (
        found["lake.churn-deleted-42"].retired_from == "churn" and found["lake.events"].retired_from is None
    )
    assert found["lake.events"].rows == 10 and found["lake.events"].files == 1
    assert list_tables(catalog, "nowhere") == []
    kept = files_under(tmp_path)
    assert [t.table for t in drop(catalog, [("lake", "churn-deleted-42")], purge=False)] == [
        "lake.churn-deleted-42"
    ]
    assert files_under(tmp_path) == kept  # dropped from the catalog, files kept
    drop(catalog, [("lake", "events")], purge=True)
    assert list_tables(catalog, "lake") == []
    events = found["lake.events"].location.removeprefix("file://")
    assert not [p for p in files_under(tmp_path) if str(p).startswith(events)]


def test_a_missing_table_drops_none(tmp_path: Path) -> None:
    catalog = with_tables(tmp_path, "orders-part-0")
    with pytest.raises(NotFound, match=r"no table lake\.orders-part-1"):
        drop(catalog, [("lake", "orders-part-0"), ("lake", "orders-part-1")], purge=False)
    assert [t.table for t in list_tables(catalog, "lake")] == ["lake.orders-part-0"]


def test_a_catalog_failing_midway_says_what_it_dropped(tmp_path: Path) -> None:
    catalog = with_tables(tmp_path, "orders-part-0", "orders-part-1")
    real = catalog.drop_table
    calls: list[Any] = []

    def failing(ident: Any) -> None:
        calls.append(ident)
        if len(calls) == 2:
            raise OSError("catalog unreachable")
        real(ident)

    catalog.drop_table = failing
    with pytest.raises(DropFailed) as failed:
        drop(catalog, [("lake", "orders-part-0"), ("lake", "orders-part-1")], purge=False)
    assert [t.table for t in failed.value.done] == ["lake.orders-part-0"]
    assert isinstance(failed.value.cause, OSError)
    assert [t.table for t in list_tables(catalog, "lake")] == ["lake.orders-part-1"]
