"""Where a broker's table work runs: by default one worker process per broker (`tables.worker_process`), so
the per-record decoding, the Parquet writes and pyiceberg's Python run outside the broker's interpreter and
do not take the GIL from publishes (docs/benchmarks.md, "Topics as Iceberg tables"); else a thread.

`dispatch` is the one entry point, the same in both: it keeps one catalog client per catalog and one
`TableWriter` per table, and runs one operation of the writer. Everything it takes and returns is
picklable: the catalog spec, the table's name, its `ShapeSpec` (the registry's version records: parsed
schemas do not pickle; `shapes.build` parses them here) and partitioning, the operation's arguments
(stored records for an append).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

from . import committer, shapes
from .catalog import CatalogSpec, open_catalog
from .committer import TableWriter
from .packing import unpack
from .shape_spec import ShapeSpec
from .typed import Records, run_to_arrow

_catalogs: dict[tuple[str, str, tuple[tuple[str, str], ...]], Any] = {}
_writers: dict[tuple[str, str, str, str], tuple[TableWriter, ShapeSpec | None]] = {}
_lock = threading.Lock()
PARENT_POLL_SECONDS = 1.0


def init_worker(parent: int, nice: int = 0) -> None:
    """A worker process's start: its faults kill the broker too, and it ends when the broker is gone. Its
    niceness goes up by `nice` (`tables.worker_nice`): on a busy machine the broker's publishes get the
    CPU first and the table catches up in the gaps."""
    committer.FAULT_KILLS = (parent,)
    if nice > 0:
        os.nice(nice)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C reaches the broker, which stops us

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_SECONDS)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _writer(
    spec: CatalogSpec, ident: tuple[str, str], shape: ShapeSpec | None, partition: str, reopen: bool
) -> TableWriter:
    with _lock:
        ckey = (spec.uri, spec.warehouse, tuple(sorted(spec.properties.items())))
        if ckey not in _catalogs:
            _catalogs[ckey] = open_catalog(spec)
        wkey = (spec.uri, spec.warehouse, *ident)
        hit = _writers.get(wkey)
        if hit is None or reopen or hit[0].partition != partition:
            built, writers = shapes.build(shape)
            w = TableWriter(_catalogs[ckey], ident, built, partition, writers)
        else:
            w = hit[0]
            if hit[1] != shape:
                # the subject has a new version: InvalidArgument when the table cannot follow it
                w.evolve_to(*shapes.build(shape))
        _writers[wkey] = (w, shape)
        return w


def dispatch(
    spec: CatalogSpec,
    ident: tuple[str, str],
    shape: ShapeSpec | None,
    partition: str,
    reopen: bool,
    op: str,
    *args: Any,
) -> Any:
    """Run one operation of the table's writer: `append_records(records, start, end, epoch)`,
    `append_packed(offsets, lengths, blob, start, end, epoch)` (`pack`'s form), `append_wal(run, epoch)`
    (the records read here from a WAL segment file: `storage/wal/runs.py`; RunUnreadable when they are
    not there as expected), or any `TableWriter` method by name (state, files, compact, drop_below,
    expire, stamp, sweep, retire)."""
    w = _writer(spec, ident, shape, partition, reopen)
    if op == "append_wal":
        from ister.storage.wal.runs import WalRun, read_run

        run: WalRun = args[0]
        rows = run_to_arrow(w.shape, run.first, read_run(run), writers=w.writers)
        return w.append(rows, run.first, run.end, *args[1:])
    if op == "append_records":
        records: Records = args[0]
        return w.append(w.rows(records), *args[1:])
    if op == "append_packed":
        return w.append(w.rows(unpack(*args[:3])), *args[3:])
    return getattr(w, op)(*args)


__all__ = ["dispatch", "init_worker"]
