"""Schema evolution of a topic's table: the columns of an old and a new shape merged the way Iceberg can
evolve a table without rewriting its files.

Columns are matched by name (nested ones by path). A column of both keeps its id and takes the wider
type: int → long, float → double, decimal(P,S) → decimal(P',S) with P' ≥ P; lists, maps and structs merge
part by part. A column only the new shape has is added, optional (the table's older rows have none). A
column only the old shape has is kept, optional: the table still holds the older rows' values, and newer
rows have null there. A column is required only while both shapes require it. Any other change (a type
changed, narrowed or of another kind, a decimal's scale) is refused with InvalidArgument naming the column.
"""

from __future__ import annotations

from collections.abc import Sequence

from ister.core.schema.shape_model import Atom, DecimalOf, DType, FieldOf, ListOf, MapOf, StructOf
from ister.errors import InvalidArgument
from ister.tables.typed_types import Path, describe

_WIDER = {("int", "long"), ("float", "double")}


def merge_columns(path: Path, old: Sequence[FieldOf], new: Sequence[FieldOf]) -> tuple[FieldOf, ...]:
    """Old columns in their order (merged with the new ones of the same name), then the added ones."""
    by_name = {f.name: f for f in new}
    out: list[FieldOf] = []
    for f in old:
        g = by_name.get(f.name)
        if g is None:
            out.append(FieldOf(f.name, f.dtype, True))
        else:
            merged = merge_type((*path, f.name), f.dtype, g.dtype)
            out.append(FieldOf(f.name, merged, f.nullable or g.nullable))
    known = {f.name for f in old}
    out.extend(FieldOf(g.name, g.dtype, True) for g in new if g.name not in known)
    return tuple(out)


def merge_type(path: Path, old: DType, new: DType) -> DType:
    if old == new:
        return old
    if isinstance(old, Atom) and isinstance(new, Atom) and (old.name, new.name) in _WIDER:
        return new
    if (
        isinstance(old, DecimalOf)
        and isinstance(new, DecimalOf)
        and new.scale == old.scale
        and new.precision >= old.precision
    ):
        return new
    if isinstance(old, ListOf) and isinstance(new, ListOf):
        item = merge_type((*path, "element"), old.item, new.item)
        return ListOf(item, old.item_nullable or new.item_nullable)
    if isinstance(old, MapOf) and isinstance(new, MapOf):
        key = merge_type((*path, "key"), old.key, new.key)
        value = merge_type((*path, "value"), old.value, new.value)
        return MapOf(key, value, old.value_nullable or new.value_nullable)
    if isinstance(old, StructOf) and isinstance(new, StructOf):
        return StructOf(merge_columns(path, old.fields, new.fields))
    raise InvalidArgument(
        f"the topic's table cannot evolve: column {'.'.join(path)} is {describe(old)} and the new schema "
        f"makes it {describe(new)}; a table only widens int to long, float to double and a decimal's "
        "precision (same scale), and adds columns"
    )
