"""Exactly-once file output that other engines can read: a batch's files appear in the table only once
the batch is complete.

Spark's streaming file sink writes each batch straight into the table and lists the committed files in
`_spark_metadata`, which only Spark reads: DuckDB, `pyarrow.dataset` or Trino also see the 0-byte file a
killed batch leaves behind, or the complete files of a batch that never committed (which Spark writes
again: they would count those rows twice). So the export writes each micro-batch with Spark's batch
writer into `<table>/_ister_staging/<queryId>/<batchId>/` (a name every engine skips: it starts with
`_`), and publishes it once Spark has committed that write (its `_SUCCESS` file) by moving the files into
the table's partition directories, then leaves a marker `<checkpoint>/ister_published/<batchId>`.

Every crash leaves a state the next run repairs before it writes anything:
* a staged batch without `_SUCCESS` (killed during the write) is deleted; Spark runs the batch again;
* a staged batch with `_SUCCESS` but no marker (killed while moving) is published (moves are resumed);
* a batch with a marker is not written again when Spark replays it (killed before Spark's own commit).
A row is never in the table twice and no partial file is ever visible; a batch becomes visible file by
file (moves are renames, one per file), so a reader that lists the table while a batch is being moved, or
after a crash in the middle of the moves, sees part of that batch until the moves are completed.

File system calls go through Hadoop's FileSystem (py4j), so the table may be anything Spark can write.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ister.errors import StorageError

STAGING_DIR = "_ister_staging"
MARKERS_DIR = "ister_published"  # in the checkpoint directory
KEEP_MARKERS = 10  # Spark only replays its last planned batch; older markers are kept for inspection


def _hidden(name: str) -> bool:
    return name.startswith(("_", "."))


class StagedOutput:
    """One export query's staged writes into `table` (`checkpoint` is the query's checkpoint)."""

    def __init__(
        self, spark: Any, table: str, checkpoint: str, fmt: str, partition_by: Sequence[str]
    ) -> None:
        self._jvm = spark.sparkContext._jvm
        conf = spark.sparkContext._jsc.hadoopConfiguration()
        self._path = self._jvm.org.apache.hadoop.fs.Path
        self.table = self._path(table)
        self.fs = self.table.getFileSystem(conf)
        self.checkpoint = self._path(checkpoint)
        self.cp_fs = self.checkpoint.getFileSystem(conf)
        self.markers = self._path(self.checkpoint, MARKERS_DIR)
        self.format = fmt
        self.partition_by = list(partition_by)
        self._query_id: str | None = None

    def query_id(self) -> str | None:
        """The id Spark keeps in the checkpoint (`metadata`), the same on every restart (None before the
        query first started): staging of two queries into one table never mixes."""
        if self._query_id is None:
            meta = self._path(self.checkpoint, "metadata")
            if not self.cp_fs.exists(meta):
                return None
            io = self._jvm.java.io
            reader = io.BufferedReader(io.InputStreamReader(self.cp_fs.open(meta), "UTF-8"))
            try:
                line = reader.readLine()
            finally:
                reader.close()
            try:
                self._query_id = str(json.loads(line or "")["id"])
            except (ValueError, KeyError, TypeError):
                raise StorageError(f"checkpoint metadata {meta.toString()} has no query id") from None
        return self._query_id

    def _staging(self) -> Any:
        query = self.query_id()
        if query is None:
            raise StorageError("the export query has not started: its checkpoint has no metadata yet")
        return self._path(self._path(self.table, STAGING_DIR), query)

    def _marker(self, batch_id: int) -> Any:
        return self._path(self.markers, str(batch_id))

    def written_by_file_sink(self) -> bool:
        """Whether Spark's streaming file sink wrote this table (its `_spark_metadata` log)."""
        return bool(self.fs.exists(self._path(self.table, "_spark_metadata")))

    def published(self, batch_id: int) -> bool:
        return bool(self.cp_fs.exists(self._marker(batch_id)))

    # -- the three steps -------------------------------------------------------------------------------------
    def recover(self) -> None:
        """Repair what a crash left: publish the complete staged batches, delete the others."""
        if self.query_id() is None:
            return  # a new query: nothing of it can be staged
        staging = self._staging()
        if not self.fs.exists(staging):
            return
        for status in self.fs.listStatus(staging):
            path = status.getPath()
            name = path.getName()
            if not name.isdigit():
                self.fs.delete(path, True)
            elif self.published(int(name)):
                self.fs.delete(path, True)  # published; only the emptied directory was left
            elif self.fs.exists(self._path(path, "_SUCCESS")):
                self.publish(int(name))
            else:
                self.fs.delete(path, True)  # killed during the write: Spark runs the batch again

    def write(self, df: Any, batch_id: int) -> None:
        """`foreachBatch`: one micro-batch into the table, exactly once."""
        self.recover()
        if self.published(batch_id):
            return  # a replay of a batch that is in the table already
        target = self._path(self._staging(), str(batch_id))
        writer = df.write.mode("overwrite").format(self.format)
        if self.partition_by:
            writer = writer.partitionBy(*self.partition_by)
        writer.save(target.toString())  # Spark's batch write: its own task commits, then `_SUCCESS`
        self.publish(batch_id)

    def publish(self, batch_id: int) -> None:
        """Move a complete staged batch's files into the table, then mark the batch published."""
        source = self._path(self._staging(), str(batch_id))
        self._move_tree(source, self.table)
        out = self.cp_fs.create(self._marker(batch_id), True)
        out.close()
        self.fs.delete(source, True)
        for status in self.cp_fs.listStatus(self.markers):
            name = status.getPath().getName()
            if name.isdigit() and int(name) < batch_id - KEEP_MARKERS:
                self.cp_fs.delete(status.getPath(), False)

    def _move_tree(self, source: Any, target: Any) -> None:
        for status in self.fs.listStatus(source):
            path = status.getPath()
            name = path.getName()
            if _hidden(name):
                continue  # _SUCCESS, _temporary, checksums
            destination = self._path(target, name)
            if status.isDirectory():
                self._move_tree(path, destination)
                continue
            self.fs.mkdirs(target)
            if self.fs.rename(path, destination):
                continue
            # A store whose rename is copy + delete may have copied before a crash: copy again.
            if self.fs.exists(destination):
                self.fs.delete(destination, False)
            if not self.fs.rename(path, destination):
                raise StorageError(f"cannot move {path.toString()} to {destination.toString()}")
