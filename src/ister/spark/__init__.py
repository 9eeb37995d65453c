"""Spark connector: `ister.spark.register(spark)` adds the `ister` format (PySpark Python data sources).

Needs the `spark` extra (`pip install 'ister[spark]'`: pyspark 4.3 and pyarrow). See docs/spark.md.
Spark runs the connector in its own Python workers, started with `PYSPARK_PYTHON` (default `python3` on
the PATH): that interpreter must have `ister` too. `register` warns when it looks like another one.
"""

from __future__ import annotations

import logging
import shutil
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def workers_python_warning(python_exec: str) -> str | None:
    """Why Spark's Python workers (`python_exec`) may lack ister, or None when they run this environment
    (the same `bin` directory as this interpreter)."""
    found = shutil.which(python_exec) or python_exec
    if Path(found).absolute().parent == Path(sys.executable).absolute().parent:
        return None
    return (
        f"Spark's Python workers run {python_exec!r} ({found}), not this environment's "
        f"{sys.executable}: unless ister is installed there too, reads and writes fail in the workers "
        f"(ModuleNotFoundError). Set PYSPARK_PYTHON={sys.executable} before the session is created."
    )


def register(spark: Any) -> None:
    """Register the `ister` data source with a SparkSession (once per session)."""
    from ister.spark.source import IsterDataSource

    try:
        python_exec = spark.sparkContext.pythonExec
    except Exception:  # Spark Connect has no SparkContext: the server's workers are not ours to check
        python_exec = None
    warning = workers_python_warning(python_exec) if isinstance(python_exec, str) else None
    if warning is not None:
        log.warning("%s", warning)
    spark.dataSource.register(IsterDataSource)


def read(spark: Any, options: dict[str, str] | None = None, **more: str) -> Any:
    """A batch read of topics (the `ister` format's options) with exported history read by Spark's own
    Parquet reader from the tier's Parquet copies; see `ister.spark.batch.read` and docs/spark.md."""
    from ister.spark.batch import read as batch_read

    return batch_read(spark, options, **more)


__all__ = ["read", "register", "workers_python_warning"]
