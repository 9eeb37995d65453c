"""A topic's table shape from its `ShapeSpec` (the worker side of `shape_spec.py`): the layouts of the
subject's versions merged in order (`typed.evolve`), so the table holds the columns of all of them, and the
Avro versions as writer schemas for records stamped with an older version than the latest."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

from ister.core.schema import ParsedSchema, SchemaType
from ister.schema.records import schema_of_record

from .shape_spec import ShapeSpec
from .typed import TableShape, evolve, table_shape

BYTES_SHAPE = table_shape(None)
Built = tuple[TableShape, Mapping[int, ParsedSchema]]
_CACHE: OrderedDict[str, Built] = OrderedDict()  # by the spec's repr (its content; it holds dicts)
_CACHED = 256


def build(spec: ShapeSpec | None) -> Built:
    """(shape, Avro writer schemas by version); InvalidArgument when two versions cannot share a table."""
    if spec is None:
        return BYTES_SHAPE, {}
    key = repr(spec)
    hit = _CACHE.get(key)
    if hit is not None:
        _CACHE.move_to_end(key)
        return hit
    schemas = [(v, schema_of_record(record)) for v, record in spec.versions]
    shape: TableShape | None = None
    for v, schema in schemas:
        nxt = table_shape(schema, v)
        shape = nxt if shape is None else evolve(shape, nxt)
    if shape is None:
        shape = BYTES_SHAPE
    built: Built = (shape, {v: s for v, s in schemas if s.type is SchemaType.AVRO})
    _CACHE[key] = built
    if len(_CACHE) > _CACHED:
        _CACHE.popitem(last=False)
    return built


__all__ = ["BYTES_SHAPE", "build"]
