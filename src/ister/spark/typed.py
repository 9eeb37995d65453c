"""Registry schemas as Spark types (`valueFormat=schema`): Avro, JSON Schema and Protobuf → a Spark type,
together with the conversion of a decoded value into what Arrow takes for that type.

The schema walk is `ister.core.schema.shapes` (shared with the topic tables); here its neutral types
become Spark's. A `Shape` is the Spark type of a value, whether it may be null, and `conv` (None when the
decoded Python value is already what Arrow takes). A conversion raises `Unreadable` when a value does not
fit the type (a JSON record of an older version whose field had another type, say): the source then
treats the record as corrupt (PERMISSIVE: null value and the raw payload in the corrupt column; FAILFAST:
the query fails). Pure: no Spark session, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from ister.core.schema import ParsedSchema
from ister.core.schema import shapes as neutral
from ister.core.schema.shape_model import (
    MAX_DECIMAL_PRECISION,
    Atom,
    Conv,
    DecimalOf,
    DType,
    ListOf,
    MapOf,
    StructOf,
    Unreadable,
)
from ister.errors import InvalidArgument

__all__ = ["MAX_DECIMAL_PRECISION", "Shape", "Unreadable", "shape_of", "spark_type"]


@dataclass(frozen=True)
class Shape:
    dtype: DataType
    nullable: bool = True
    conv: Conv | None = None  # decoded value → Arrow's value; None: as it is


_ATOMS: dict[str, DataType] = {
    "boolean": BooleanType(),
    "int": IntegerType(),
    "long": LongType(),
    "float": FloatType(),
    "double": DoubleType(),
    "binary": BinaryType(),
    "string": StringType(),
    "date": DateType(),
    "timestamp": TimestampType(),
    "timestamp_ntz": TimestampNTZType(),
}


def spark_type(t: DType) -> DataType:
    if isinstance(t, Atom):
        return _ATOMS[t.name]
    if isinstance(t, DecimalOf):
        return DecimalType(t.precision, t.scale)
    if isinstance(t, ListOf):
        return ArrayType(spark_type(t.item), t.item_nullable)
    if isinstance(t, MapOf):
        return MapType(spark_type(t.key), spark_type(t.value), t.value_nullable)
    if isinstance(t, StructOf):
        return StructType([StructField(f.name, spark_type(f.dtype), f.nullable) for f in t.fields])
    raise AssertionError(f"unknown type {t!r}")


def shape_of(schema: ParsedSchema) -> Shape:
    """The Spark shape of a registry schema's values; InvalidArgument for what Spark cannot hold."""
    if schema.type.value not in ("avro", "json_schema", "protobuf"):
        raise InvalidArgument(
            "valueFormat=schema decodes avro, json_schema and protobuf subjects; this one is "
            f"{schema.type.value} (use valueFormat=raw)"
        )
    shape = neutral.shape_of(schema)
    return Shape(spark_type(shape.dtype), shape.nullable, shape.conv)
