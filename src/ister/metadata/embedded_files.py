"""The embedded metadata store's files: the SQLite copy of every key (`SqliteCopy`; table kv(key, value,
revision, lease) and meta(revision, schema)) and the lock file that keeps a second process (or store) off
the directory (`lock_directory`). Blocking; the store calls them on its commit thread."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sqlite3
from pathlib import Path

from ister.errors import MetadataError
from ister.limits import METADATA_TIMEOUT_SECONDS

log = logging.getLogger(__name__)

DB_FILE = "metadata.sqlite3"
LOCK_FILE = "metadata.lock"
SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (
    key TEXT PRIMARY KEY NOT NULL,
    value BLOB NOT NULL,
    revision INTEGER NOT NULL,
    lease INTEGER
);
CREATE TABLE IF NOT EXISTS meta (
    name TEXT PRIMARY KEY NOT NULL,
    value INTEGER NOT NULL
);
"""


class StoreLocked(MetadataError):
    """Another process (or store) already has the metadata directory open."""

    retriable = False


Row = tuple[str, bytes, int, int | None]
PutOp = tuple[str, bytes, int | None]  # (key, encoded value, lease)


class SqliteCopy:
    """The durable copy: table kv(key, value, revision, lease) and meta(revision, schema)."""

    def __init__(self, path: Path) -> None:
        try:
            # Used by one thread at a time: the opener, then the commit thread (see EmbeddedStore).
            self._conn = sqlite3.connect(
                str(path), timeout=METADATA_TIMEOUT_SECONDS, isolation_level=None, check_same_thread=False
            )
            mode = self._conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise MetadataError(f"{path}: sqlite refused WAL journal mode (got {mode!r})")
            self._conn.execute("PRAGMA synchronous=FULL")
            self._conn.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            raise MetadataError(f"cannot open metadata database {path}: {exc}") from exc
        self._path = path

    def load(self) -> tuple[int, list[Row]]:
        """(revision, rows), after deleting the rows of leases from a previous process."""
        try:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                meta = dict(self._conn.execute("SELECT name, value FROM meta").fetchall())
                schema = meta.get("schema")
                if schema is not None and schema != SCHEMA_VERSION:
                    raise MetadataError(f"{self._path}: unsupported metadata schema version {schema}")
                max_row = self._conn.execute("SELECT MAX(revision) FROM kv").fetchone()[0] or 0
                revision = max(int(meta.get("revision", 0)), int(max_row))
                stale = self._conn.execute("DELETE FROM kv WHERE lease IS NOT NULL").rowcount
                if stale:
                    revision += 1
                    log.info("deleted %d metadata keys held by leases of a previous process", stale)
                self._conn.executemany(
                    "INSERT OR REPLACE INTO meta(name, value) VALUES (?, ?)",
                    [("schema", SCHEMA_VERSION), ("revision", revision)],
                )
                rows: list[Row] = self._conn.execute("SELECT key, value, revision, lease FROM kv").fetchall()
                self._conn.execute("COMMIT")
            except BaseException:
                self._rollback()
                raise
        except sqlite3.Error as exc:
            raise MetadataError(f"cannot read metadata database {self._path}: {exc}") from exc
        return revision, rows

    def commit(self, group: list[tuple[int, list[PutOp], list[str]]]) -> None:
        """Commit mutations (revision, puts, deletes), in order, in one transaction (blocking)."""
        try:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                for revision, puts, deletes in group:
                    if puts:
                        self._conn.executemany(
                            "INSERT OR REPLACE INTO kv(key, value, revision, lease) VALUES (?, ?, ?, ?)",
                            [(k, raw, revision, lease) for k, raw, lease in puts],
                        )
                    if deletes:
                        self._conn.executemany("DELETE FROM kv WHERE key = ?", [(k,) for k in deletes])
                self._conn.execute("UPDATE meta SET value = ? WHERE name = 'revision'", (group[-1][0],))
                self._conn.execute("COMMIT")
            except BaseException:
                self._rollback()
                raise
        except sqlite3.Error as exc:
            raise MetadataError(f"metadata write to {self._path} failed: {exc}") from exc

    def _rollback(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._conn.execute("ROLLBACK")

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._conn.close()


def lock_directory(directory: Path) -> int:
    path = directory / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
        finally:
            os.close(fd)
        raise StoreLocked(
            f"metadata directory {directory} is already in use (lock {path} held by pid {holder}); "
            "another broker is running on this data directory"
        ) from None
    except OSError:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
    return fd
