"""Spark connector: `ister.spark.register(spark)` adds the `ister` format (PySpark Python data sources).

Needs the `spark` extra (`pip install 'ister[spark]'`: pyspark 4.3 and pyarrow). See docs/spark.md.
"""

from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    """Register the `ister` data source with a SparkSession (once per session)."""
    from ister.spark.source import IsterDataSource

    spark.dataSource.register(IsterDataSource)


__all__ = ["register"]
