"""pyiceberg's Transaction with its metadata worked out once per set of staged updates.

pyiceberg's `Transaction.table_metadata` applies the staged updates to the table's metadata and returns a
deep copy of the result at every access, and an append reads it about twenty times (the schema check, the
Parquet write, the snapshot producer, the commit). A copy costs in proportion to the snapshots the table
keeps (an hour of 10 s commits: 8 ms each here), so an append spent most of its fixed cost copying. The
result depends only on the table's metadata and the staged updates, both replaced rather than changed
(pyiceberg's models are frozen; `_updates` is a tuple that grows by replacement), so it is kept until either
is another object; with nothing staged it is the table's metadata itself, which pyiceberg's `Table` hands out
uncopied anyway. Imports pyiceberg: load it only where pyiceberg is (the table worker).
"""

from __future__ import annotations

from typing import Any

from pyiceberg.table import Transaction
from pyiceberg.table.metadata import TableMetadata


class Transaction1(Transaction):
    """A `Transaction` whose `table_metadata` is computed once per (table metadata, staged updates)."""

    _memo: tuple[Any, Any, TableMetadata] | None = None

    @property
    def table_metadata(self) -> TableMetadata:
        base, updates, memo = self._table.metadata, self._updates, self._memo
        if not updates:
            return base  # nothing staged: the table's own metadata, as `Table` itself hands it out
        if memo is not None and memo[0] is base and memo[1] is updates:
            return memo[2]
        found = super().table_metadata
        self._memo = (base, updates, found)
        return found


def transaction(table: Any) -> Transaction1:
    """A transaction on `table` (what `table.transaction()` gives, with the metadata kept)."""
    return Transaction1(table)


__all__ = ["Transaction1", "transaction"]
