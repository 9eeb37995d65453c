"""Listing and dropping topics' tables in the catalog (docs/tables.md, "Dropping a table"), for
`ister admin topics drop-table` and `ister admin namespaces tables`. Blocking pyiceberg calls: the CLI runs
them itself against the catalog the broker names (it never creates a catalog or a namespace)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ister.errors import InvalidArgument, NotFound, Unavailable
from ister.tables.catalog import CATALOG_NAME, CatalogSpec

RETIRED = re.compile(r"^(?P<topic>.+)-deleted-(?P<revision>\d+)$")  # tables/committer.py's `retire`


@dataclass(frozen=True, slots=True)
class TableInfo:
    table: str  # `namespace.name`
    rows: int | None  # the current snapshot's total-records (None: no snapshot, or not said)
    files: int | None  # its total-data-files
    location: str
    retired_from: str | None  # the topic name of a `<topic>-deleted-<revision>` table, None otherwise


def open_existing(spec: CatalogSpec) -> Any:
    """The catalog, without creating anything: a SQLite catalog file that does not exist is NotFound (run
    the command where the broker's data directory is), not a new empty catalog."""
    from pyiceberg.catalog import load_catalog

    if spec.uri.startswith("sqlite:///"):
        path = Path(spec.uri.removeprefix("sqlite:///"))
        if not path.is_file():
            raise NotFound(
                f"the catalog file {path} does not exist here (no table was committed yet, or run this "
                "where the broker's data is)"
            )
    return load_catalog(CATALOG_NAME, **spec.load_properties())


def info(catalog: Any, ident: tuple[str, str]) -> TableInfo:
    """A table's size and location (NoSuchTableError when it is not in the catalog)."""
    table = catalog.load_table(ident)
    snapshot = table.current_snapshot()
    summary = snapshot.summary if snapshot is not None else None
    match = RETIRED.match(ident[1])
    return TableInfo(
        table=".".join(ident),
        rows=_count(summary, "total-records"),
        files=_count(summary, "total-data-files"),
        location=table.metadata.location,
        retired_from=match["topic"] if match else None,
    )


def _count(summary: Any, key: str) -> int | None:
    value = summary.get(key) if summary is not None else None
    return int(value) if isinstance(value, str) and value.isdigit() else None


def list_tables(catalog: Any, namespace: str) -> list[TableInfo]:
    """Every table of the Iceberg namespace (an Ister namespace), by name; [] when it has none."""
    from pyiceberg.exceptions import NoSuchNamespaceError

    try:
        idents = catalog.list_tables(namespace)
    except NoSuchNamespaceError:
        return []
    return [info(catalog, (ident[0], ident[-1])) for ident in sorted(idents)]


def drop(catalog: Any, idents: list[tuple[str, str]], purge: bool) -> list[TableInfo]:
    """Drop each table (`purge`: with its data and metadata files, pyiceberg's purge_table); what was
    dropped. Every table is looked up first: one missing drops none (NotFound)."""
    from pyiceberg.exceptions import NoSuchTableError

    found: list[TableInfo] = []
    for ident in idents:
        try:
            found.append(info(catalog, ident))
        except NoSuchTableError:
            raise NotFound(f"the catalog has no table {'.'.join(ident)}") from None
    if not found:
        raise InvalidArgument("no table to drop")
    for i, ident in enumerate(idents):
        try:
            (catalog.purge_table if purge else catalog.drop_table)(ident)
        except Exception as exc:  # the catalog's own errors: SQL, HTTP, auth
            raise DropFailed(found[:i], exc) from exc
    return found


class DropFailed(Unavailable):
    """A drop the catalog refused or did not answer, after `done` were dropped (a partitioned topic's
    tables are dropped one by one)."""

    def __init__(self, done: list[TableInfo], cause: BaseException) -> None:
        super().__init__(str(cause))
        self.done = done
        self.cause = cause


__all__ = ["RETIRED", "DropFailed", "TableInfo", "drop", "info", "list_tables", "open_existing"]
