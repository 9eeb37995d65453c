"""One topic's Iceberg table, written exactly once (docs/tables.md, "Exactly once").

Every snapshot Ister commits carries in its summary `ister.offset.end` (one past the highest offset the
table then holds), `ister.offset.start` (the first offset it adds; appends only) and `ister.epoch` (the
committing owner's epoch). Before each commit the writer reads them from the table's current snapshot:
what is at or below the end is already there and is not added again, whatever crashed where before; an
owner whose epoch is below the table's is deposed and refused. The commit itself is conditional on that
snapshot (pyiceberg's requirement on the branch head and the table's uuid, with its own commit retries
turned off), so two writers that read the same state cannot both land.

The snapshot is the writer's view of the table, not a catalog read per commit: the metadata it loaded on
opening the table, then what each of its own commits returned. It is the table's only writer, so the view
is current; when it is not (another writer committed: a new leader, another tool), the conditional commit
is refused, nothing of it lands, and the committer reopens the table (a fresh load) for its next pass,
which reads the end and the epoch again: so a stale view costs a retried pass, never a row twice.

Blocking (pyiceberg does file and catalog I/O): the broker calls these methods from a worker thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ister.core.schema import ParsedSchema
from ister.errors import FailedPrecondition, Fenced, InvalidArgument

from .transaction import transaction
from .typed import Records, TableShape, adopt_ids, to_arrow

log = logging.getLogger(__name__)

END = "ister.offset.end"
START = "ister.offset.start"
EPOCH = "ister.epoch"
OP = "ister.op"
# the topic's incarnation (the metadata revision that created it): a topic deleted and created again under
# the name has another, and must not continue the old one's table (its offsets start at 0 again)
TOPIC = "ister.topic.revision"
TABLE_PROPERTIES = {
    "format-version": "2",
    # A commit is refused rather than replayed on a newer head: the offset check must run again first.
    "commit.retry.num-retries": "0",
    # Merge manifests as appends come, so a table committed every few seconds keeps few of them.
    "commit.manifest-merge.enabled": "true",
}
# How data files are written; given to tables Ister made before too (`_ensure`), unless already set.
WRITE_PROPERTIES = {
    # Arrow dictionary-encodes a column until its dictionary reaches this size, then writes it plain. At
    # pyiceberg's 2 MiB every unique column (offset, value) was hashed into a dictionary for 100,000 rows
    # for nothing; at 64 KiB they fall back early while few-valued ones (producer, keys) stay dictionaries:
    # the write 0.28 -> 0.23 us per row, files a tenth smaller (half for repeated values), scans no slower.
    "write.parquet.dict-size-bytes": str(64 * 1024),
    # Each commit writes a new metadata file (every 10 s by default): keep the last few, delete older ones
    # as commits come (pyiceberg's default keeps every one forever and the warehouse only grows).
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "10",
}
MAX_APPENDS_READ = 64  # a file list older than this many appends is read again whole (TableWriter.files)
LARGE_FILE_ROWS = 50_000  # a data file this large is not compacted (see TableWriter.compact)
FAULT_ENV = "ISTER_TABLES_FAULT"  # tests: kill -9 the broker at a commit step (after-write, after-commit)
FAULT_KILLS: tuple[int, ...] = ()  # in a table worker process: the broker, killed first


def _fault(step: str) -> None:
    if os.environ.get(FAULT_ENV) == step:
        log.error("fault injection: kill -9 at %s", step)
        for pid in (*FAULT_KILLS, os.getpid()):
            os.kill(pid, signal.SIGKILL)


@dataclass(frozen=True, slots=True)
class TableState:
    end: int  # one past the highest offset committed (0: nothing yet)
    epoch: int  # the highest owner epoch that committed
    snapshot_id: int | None
    topic: int = 0  # the topic incarnation that committed (0: not recorded, a table older than the stamp)


@dataclass(frozen=True, slots=True)
class DataFileRange:
    path: str
    first: int
    last: int
    rows: int


def partition_spec(partition: str, schema: Any) -> Any:
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import DayTransform, HourTransform

    source = schema.find_field("publish_time").field_id
    transform: Any = HourTransform() if partition == "hour" else DayTransform()
    return PartitionSpec(
        PartitionField(source_id=source, field_id=1000, transform=transform, name=f"publish_{partition}")
    )


class TableWriter:
    """Writes one topic's table (blocking methods)."""

    def __init__(
        self,
        catalog: Any,
        ident: tuple[str, str],
        shape: TableShape,
        partition: str,
        writers: Mapping[int, ParsedSchema] | None = None,
    ) -> None:
        self.catalog = catalog
        self.ident = ident
        self.partition = partition
        self.writers: Mapping[int, ParsedSchema] = writers or {}
        self.topic = 0  # the topic's incarnation (`stamp`), recorded in the snapshots it commits
        self._files: tuple[int | None, list[DataFileRange]] | None = None  # a snapshot's id and data files
        self._manifest_lists: dict[int, tuple[Any, ...]] = {}  # snapshot id -> its manifests (`_all_files`)
        self._manifest_files: dict[str, frozenset[str]] = {}  # manifest path -> the data files it names
        self.table = self._ensure(shape)
        # the table's own field ids (a table evolved earlier may number added columns its own way)
        self.shape = adopt_ids(shape, self.table.schema())

    def _ensure(self, shape: TableShape) -> Any:
        from pyiceberg.exceptions import (
            NamespaceAlreadyExistsError,
            NoSuchTableError,
            TableAlreadyExistsError,
        )

        with contextlib.suppress(NamespaceAlreadyExistsError):
            self.catalog.create_namespace(self.ident[0])
        schema = shape.iceberg_schema()
        try:  # loaded first: a create that loses to an existing table still writes a metadata file
            table = self.catalog.load_table(self.ident)
        except NoSuchTableError:
            try:
                table = self.catalog.create_table(
                    self.ident,
                    schema=schema,
                    partition_spec=partition_spec(self.partition, schema),
                    properties={**TABLE_PROPERTIES, **WRITE_PROPERTIES},
                    location=new_location(self.catalog, self.ident),
                )
            except TableAlreadyExistsError:  # another writer created it meanwhile
                table = self.catalog.load_table(self.ident)
        self._respec(table)
        _follow(table, shape)  # the topic's schema evolved (or was bound) while no one committed
        unset = {k: v for k, v in WRITE_PROPERTIES.items() if k not in table.properties}
        if unset:  # a table made before these were given; they only save CPU: a refusal stops nothing
            try:
                with transaction(table) as tx:
                    tx.set_properties(unset)
            except Exception as exc:  # the catalog down or refusing: the next opening tries again
                log.warning("table %s: write properties not set (%s): %s", ".".join(self.ident), unset, exc)
        return table

    def _respec(self, table: Any) -> None:
        """A changed partitioning applies to files written from now on (Iceberg partition evolution)."""
        name = f"publish_{self.partition}"
        fields = table.spec().fields
        if [f.name for f in fields] == [name]:
            return
        from pyiceberg.transforms import DayTransform, HourTransform

        with table.update_spec() as update:
            for f in fields:
                update.remove_field(f.name)
            transform: Any = HourTransform() if self.partition == "hour" else DayTransform()
            update.add_field("publish_time", transform, name)

    def evolve_to(self, shape: TableShape, writers: Mapping[int, ParsedSchema] | None = None) -> None:
        """Take a new shape (the registry accepted a schema evolution: `typed.evolve` merged it with the
        older versions'); the table's schema gains its columns and widenings, field ids kept, and the
        shape takes the ids the catalog gave the added columns."""
        self.table.refresh()
        _follow(self.table, shape)
        self.shape = adopt_ids(shape, self.table.schema())
        self.writers = writers or {}

    def rows(self, records: Records) -> pa.Table:
        """The table rows of stored records (plain or compressed), in the shape's columns."""
        return to_arrow(self.shape, records, writers=self.writers)

    # ---- state -----------------------------------------------------------------------------------

    def state(self) -> TableState:
        """The committed end offset and epoch, as the table's current snapshot says in this writer's view:
        the metadata it loaded on opening the table (or refreshed since), or what its own last commit
        returned. No catalog read: the writer is its table's only one, and a view another commit made stale
        is refused at the next commit (`append`'s docstring), after which the committer reopens the table."""
        snap = self.table.current_snapshot()
        while snap is not None:  # a snapshot another tool committed carries no offsets: look further back
            props = snap.summary.additional_properties if snap.summary is not None else {}
            if END in props:
                topic = int(props.get(TOPIC, 0))
                return TableState(int(props[END]), int(props.get(EPOCH, 0)), snap.snapshot_id, topic)
            parent = snap.parent_snapshot_id
            snap = self.table.snapshot_by_id(parent) if parent is not None else None
        current = self.table.current_snapshot()
        return TableState(0, 0, current.snapshot_id if current is not None else None)

    def files(self) -> list[DataFileRange]:
        """The current snapshot's data files and the offsets each holds (from its column bounds), in this
        writer's view. Kept per snapshot: after appends to a snapshot whose list is known, only the files they
        added are read (a manifest list and a new manifest each), not every manifest of the table."""
        snap = self.table.current_snapshot()
        sid = snap.snapshot_id if snap is not None else None
        known = self._files
        if known is not None and known[0] == sid:
            return list(known[1])
        appends = self._appends_since(known[0]) if known is not None else None
        if known is not None and appends is not None:
            found = sorted([*known[1], *(f for a in appends for f in self._added(a))], key=_first)
        else:
            found = self._scan_files()
        self._files = (sid, found)
        return list(found)

    def _appends_since(self, listed: int | None) -> list[Any] | None:
        """The snapshots from the one whose files are `listed` to the current one when all are appends (at
        most MAX_APPENDS_READ), else None."""
        out: list[Any] = []
        snap = self.table.current_snapshot()
        while (
            snap is not None
            and snap.snapshot_id != listed
            and _is_append(snap)
            and len(out) < MAX_APPENDS_READ
        ):
            out.append(snap)
            parent = snap.parent_snapshot_id
            snap = self.table.snapshot_by_id(parent) if parent is not None else None
        reached = snap.snapshot_id if snap is not None else None
        return out if reached == listed and listed is not None else None

    def _scan_files(self) -> list[DataFileRange]:
        field_id = self._offset_id()
        return sorted(
            (r for task in self.table.scan().plan_files() if (r := _range(task.file, field_id)) is not None),
            key=_first,
        )

    def _added(self, snap: Any) -> list[DataFileRange]:
        """The data files an append snapshot added (its manifests' ADDED entries of that snapshot)."""
        from pyiceberg.manifest import ManifestContent, ManifestEntryStatus

        io, sid, field_id = self.table.io, snap.snapshot_id, self._offset_id()
        out = []
        for manifest in snap.manifests(io):
            if manifest.added_snapshot_id != sid or manifest.content != ManifestContent.DATA:
                continue
            for entry in manifest.fetch_manifest_entry(io, discard_deleted=True):
                if entry.status == ManifestEntryStatus.ADDED and entry.snapshot_id == sid:
                    r = _range(entry.data_file, field_id)
                    if r is not None:
                        out.append(r)
        return out

    def _offset_id(self) -> int:
        return int(self.table.schema().find_field("offset").field_id)

    def _check(self, epoch: int, topic: int = 0) -> TableState:
        state = self.state()
        if topic and state.topic and state.topic != topic:
            raise FailedPrecondition(
                f"table {'.'.join(self.ident)} holds the rows of an earlier topic of this name (revision "
                f"{state.topic}); this topic's is {topic}"
            )
        if state.epoch > epoch:
            raise Fenced(
                f"table {'.'.join(self.ident)} was committed at epoch {state.epoch}; this owner's is {epoch}"
            )
        return state

    def _props(self, op: str, end: int, epoch: int, topic: int, **more: int) -> dict[str, str]:
        props = {OP: op, END: str(end), EPOCH: str(epoch), **{k: str(v) for k, v in more.items()}}
        if topic:
            props[TOPIC] = str(topic)
        return props

    # ---- commits ---------------------------------------------------------------------------------

    def append(self, rows: pa.Table, start: int, end: int, epoch: int, topic: int = 0) -> int:
        """Commit the rows of offsets start..end-1 (some offsets may be missing: holes); only those above
        the table's end are added. Returns the rows added (0: already committed). `topic`: the topic's
        incarnation (0: the one `stamp` gave, if any), recorded in the snapshot; another incarnation's table
        is refused."""
        topic = topic or self.topic
        state = self._check(epoch, topic)
        if state.end >= end:
            return 0
        if state.end > start:
            rows = rows.filter(pc.greater_equal(rows.column("offset"), pa.scalar(state.end, pa.int64())))
            start = state.end
        tx = transaction(self.table)
        props = self._props("append", end, epoch, topic or state.topic, **{START: start})
        tx.append(rows, snapshot_properties=props)
        _fault("after-write")  # the data file is written; the catalog does not name it yet
        tx.commit_transaction()
        _fault("after-commit")  # committed; the broker has not seen the answer
        return int(rows.num_rows)

    def compact(self, first: int, last: int, epoch: int) -> int:
        """Replace the small data files holding offsets of first..last (an exported segment's range) by
        one file per partition, in one commit; returns the files replaced (0: nothing to do). Files of
        `LARGE_FILE_ROWS` rows or more (a backlog's commits) are left as they are unless they lie between
        small ones: rewriting them cost the worker about 1.5 us per row for no fewer files worth having."""
        from pyiceberg import expressions as ex

        e: Any = ex  # pyiceberg's predicates are pydantic models that mypy's view does not call

        files = [f for f in self.files() if first <= f.first and f.last <= last]
        small = [f for f in files if f.rows < LARGE_FILE_ROWS]
        if len(small) < 2:
            return 0
        first, last = small[0].first, max(f.last for f in small)
        inside = [f for f in files if first <= f.first and f.last <= last]
        state = self._check(epoch)
        where = e.And(e.GreaterThanOrEqual("offset", first), e.LessThanOrEqual("offset", last))
        rows = in_offset_order(self.table.scan(row_filter=where).to_arrow())
        tx = transaction(self.table)
        tx.overwrite(
            rows,
            overwrite_filter=where,
            snapshot_properties=self._props("compact", state.end, epoch, state.topic),
        )
        tx.commit_transaction()
        return len(inside)

    def drop_below(self, start: int, epoch: int) -> int:
        """Delete the rows below `start` (what retention deleted from the topic); returns files touched."""
        from pyiceberg import expressions as ex

        e: Any = ex

        doomed = [f for f in self.files() if f.first < start]
        if not doomed:
            return 0
        state = self._check(epoch)
        tx = transaction(self.table)
        tx.delete(
            e.LessThan("offset", start),
            snapshot_properties=self._props("retention", state.end, epoch, state.topic),
        )
        tx.commit_transaction()
        return len(doomed)

    def expire(self, keep_seconds: float, now: datetime | None = None) -> list[str]:
        """Expire snapshots older than `keep_seconds` (never the current one) and delete the data files
        that only they named, and their manifest lists and the manifests no kept snapshot lists (each
        commit writes one of each: kept, they would fill the warehouse); returns the data files deleted. A
        file that cannot be deleted is logged and left (data files: the orphan sweep's later)."""
        now = now or datetime.now(UTC)
        self.table.refresh()
        current = self.table.current_snapshot()
        cutoff_ms = int((now - timedelta(seconds=keep_seconds)).timestamp() * 1000)
        old = [
            s.snapshot_id
            for s in self.table.snapshots()
            if s.timestamp_ms < cutoff_ms and (current is None or s.snapshot_id != current.snapshot_id)
        ]
        if not old:
            return []
        before = self._all_files()
        manifests_before = set(self._manifest_files)
        lists_before = {s.manifest_list for s in self.table.snapshots()}
        self.table.maintenance.expire_snapshots().by_ids(old).commit()
        self.table.refresh()
        gone = sorted(before - self._all_files())
        kept_lists = {s.manifest_list for s in self.table.snapshots()}
        metadata = (manifests_before - set(self._manifest_files)) | (lists_before - kept_lists)
        deleted: list[str] = []
        data = set(gone)
        for path in [*gone, *sorted(metadata)]:
            try:
                self.table.io.delete(path)
            except FileNotFoundError:
                pass  # gone meanwhile (a sweep)
            except OSError as exc:  # the snapshots are expired already: one stuck file does not stop the rest
                log.warning("%s: could not delete %s after the expiry: %s", self.table.name(), path, exc)
                continue
            if path in data:
                deleted.append(path)
        return deleted

    def stamp(self, topic: int) -> None:
        """The topic's incarnation (its metadata revision) for the appends that follow."""
        self.topic = topic

    def sweep(self, min_age: float, now: float | None = None) -> Any:
        """Delete the data files no snapshot names that are older than `min_age` seconds (`tables/sweep.py`);
        returns its `SweepResult`."""
        from .sweep import sweep

        return sweep(self.table, self._all_files, min_age, now)

    def retire(self, name: str) -> str:
        """Rename the table to `name` (same namespace), out of the way of a new topic of this name; its
        files stay where they are (every table Ister creates has a location of its own)."""
        self.catalog.rename_table(self.ident, (self.ident[0], name))
        log.info("table %s renamed %s.%s", ".".join(self.ident), self.ident[0], name)
        return name

    def _all_files(self) -> set[str]:
        """Data files named by any snapshot the table keeps. A snapshot's manifest list and a manifest never
        change once written: what each names is kept between calls (while a kept snapshot names it), so a
        call reads only the manifest lists and manifests of snapshots it has not seen."""
        io = self.table.io
        lists: dict[int, tuple[Any, ...]] = {}
        named: dict[str, frozenset[str]] = {}
        for snap in self.table.snapshots():
            manifests = self._manifest_lists.get(snap.snapshot_id)
            if manifests is None:
                manifests = tuple(snap.manifests(io))
            lists[snap.snapshot_id] = manifests
            for manifest in manifests:
                path = manifest.manifest_path
                if path in named:
                    continue
                found = self._manifest_files.get(path)
                if found is None:
                    entries = manifest.fetch_manifest_entry(io, discard_deleted=True)
                    found = frozenset(entry.data_file.file_path for entry in entries)
                named[path] = found
        self._manifest_lists, self._manifest_files = lists, named
        return set().union(*named.values())


def _first(f: DataFileRange) -> int:
    return f.first


def _range(f: Any, field_id: int) -> DataFileRange | None:
    """A data file's offsets (its column bounds; None when it has none)."""
    from pyiceberg.conversions import from_bytes
    from pyiceberg.types import LongType

    lo, hi = f.lower_bounds.get(field_id), f.upper_bounds.get(field_id)
    if lo is None or hi is None:
        return None
    first, last = int(from_bytes(LongType(), lo)), int(from_bytes(LongType(), hi))
    return DataFileRange(f.file_path, first, last, f.record_count)


def in_offset_order(rows: pa.Table) -> pa.Table:
    """`rows` sorted by offset. A scan gives each file's rows in order, one chunk after another: the chunks
    are put in order of their first offsets (no copy), and the rows sorted (a copy of every column) only
    when files overlap (an append split across two partitions)."""
    batches = sorted(rows.to_batches(), key=lambda b: b.column("offset")[0].as_py() if b.num_rows else -1)
    ordered = pa.Table.from_batches(batches, schema=rows.schema) if batches else rows
    offsets = ordered.column("offset").combine_chunks()
    n = len(offsets)
    if n < 2 or pc.all(pc.greater(offsets.slice(1), offsets.slice(0, n - 1))).as_py():
        return ordered
    return ordered.sort_by("offset")


def _is_append(snap: Any) -> bool:
    from pyiceberg.table.snapshots import Operation

    return snap.summary is not None and snap.summary.operation == Operation.APPEND


def _follow(table: Any, shape: TableShape) -> None:
    """The table's schema made to hold the shape's rows: its columns added or widened, and a required
    column the shape lacks or leaves optional made optional (a bytes topic's `value` once the topic is
    bound to a subject: its older rows keep their payloads there, newer ones have null)."""
    schema = shape.iceberg_schema()
    if table.schema().as_struct() == schema.as_struct():
        return
    wanted = {f.name: f for f in schema.fields}
    loosen = [
        f.name
        for f in table.schema().fields
        if f.required and (f.name not in wanted or not wanted[f.name].required)
    ]
    with table.update_schema() as update:
        update.union_by_name(schema)
        for name in loosen:
            update.make_column_optional(name)


def new_location(catalog: Any, ident: tuple[str, str]) -> str | None:
    """A location no other table has, for a table a SQL (metastore) catalog creates: the warehouse's default
    path plus a random suffix. A table renamed, or dropped without purging, keeps its files at its own
    location, and a new table of the same name must not share it (its orphan sweep would take the other's
    files). None: the catalog chooses (a REST catalog assigns locations itself)."""
    from pyiceberg.catalog import MetastoreCatalog

    warehouse = catalog.properties.get("warehouse") if isinstance(catalog, MetastoreCatalog) else None
    if not isinstance(warehouse, str) or not warehouse:
        return None
    return f"{warehouse.rstrip('/')}/{ident[0]}/{ident[1]}-{uuid.uuid4().hex[:8]}"


def open_writer(
    open_catalog: Callable[[], Any], ident: tuple[str, str], shape: TableShape, partition: str
) -> TableWriter:
    if partition not in ("day", "hour"):
        raise InvalidArgument(f"unknown partitioning {partition!r}")
    return TableWriter(open_catalog(), ident, shape, partition)


def read_rows(table: Any, columns: Iterable[str] | None = None) -> pa.Table:
    """The table's current rows in offset order (tests and `ister table --check`)."""
    scan = table.scan(selected_fields=tuple(columns)) if columns is not None else table.scan()
    return scan.to_arrow().sort_by("offset")


__all__ = [
    "END",
    "EPOCH",
    "FAULT_ENV",
    "START",
    "DataFileRange",
    "TableState",
    "TableWriter",
    "open_writer",
    "partition_spec",
    "read_rows",
]
