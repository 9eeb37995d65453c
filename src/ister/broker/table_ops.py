"""Operations around a topic's table committer (docs/tables.md): the orphan-file sweep's schedule and
metrics, the committer's interruptible wait (retention wakes it), and a deleted topic's table kept out of
the way of a new topic of the same name. Kept apart from `broker/tables.py`'s pass loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter

from ister.broker.topic import Topic
from ister.clock import Clock
from ister.config import TablesSettings
from ister.errors import Unavailable
from ister.metadata import keys
from ister.metadata.cache import LocalCache

if TYPE_CHECKING:
    from ister.tables.committer import TableState

log = logging.getLogger(__name__)

orphan_sweeps = Counter(
    "ister_table_orphan_sweeps", "Orphan-file sweeps of topics' Iceberg tables (docs/tables.md)", ("result",)
)
orphan_files_deleted = Counter(
    "ister_table_orphan_files_deleted", "Data files no table snapshot named, deleted by the orphan sweep"
)

Call = Callable[..., Awaitable[Any]]


class OrphanSweeper:
    """When a table's orphan sweep is due (at the committer's first pass, then every
    `tables.orphan_sweep_interval_seconds`), and its outcome counted. A failed sweep changes nothing
    beyond the orphans it deleted before failing and does not fail the commit pass: it is retried at the
    next due time."""

    def __init__(self, settings: TablesSettings, clock: Clock) -> None:
        self._settings = settings
        self._clock = clock
        self._due = float("-inf")
        self.last_error: str | None = None

    async def maybe(self, call: Call, name: str) -> int | None:
        """Sweep when due; returns the files deleted (None: not due, or it failed)."""
        now = self._clock.monotonic()
        if now < self._due:
            return None
        self._due = now + self._settings.orphan_sweep_interval_seconds
        try:
            result = await call("sweep", self._settings.orphan_min_age_seconds)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the listing failed (store down, catalog down): nothing was deleted
            self._failed(name, f"{type(exc).__name__}: {exc}")
            return None
        orphan_files_deleted.inc(len(result.deleted))
        if result.error is not None:
            self._failed(name, result.error)
            return None
        orphan_sweeps.labels("ok").inc()
        self.last_error = None
        return len(result.deleted)

    def _failed(self, name: str, why: str) -> None:
        orphan_sweeps.labels("failed").inc()
        self.last_error = why
        log.warning("%s: orphan sweep of the table failed (retried in %.0f s): %s", name,
                    self._settings.orphan_sweep_interval_seconds, why)  # fmt: skip


async def nap(clock: Clock, wake: asyncio.Event, seconds: float) -> None:
    """Wait `seconds`, or less when `wake` is set (retention moved the topic's start offset); a wake that
    came during the pass ends the next wait at once."""
    if not wake.is_set():
        with contextlib.suppress(TimeoutError):
            async with clock.timeout(seconds):
                await wake.wait()
    wake.clear()


def topic_revision(cache: LocalCache | None, topic: Topic) -> int | None:
    """The topic's incarnation: the metadata revision of its namespace entry, written once when it is
    created (None: the mirror does not have it yet, or the topic is being deleted; or no mirror, a
    committer built by a test)."""
    if cache is None:
        return None
    kv = cache.get(keys.namespace_topic(topic.name))
    return kv.version if kv is not None else None


def retired_name(table: str, revision: int) -> str:
    return f"{table}-deleted-{revision}"


async def follow_incarnation(
    call: Call, name: str, table: str, revision: int | None, state: TableState
) -> bool:
    """Whether the table holds an earlier topic's rows (a topic deleted, then created again under its name:
    offsets restart at 0): then it is renamed `<table>-deleted-<its revision>`, kept with its rows, and the
    caller reopens a new table. Raises Unavailable while this topic's revision is not known yet."""
    if not state.topic or state.topic == revision:
        return False
    if revision is None:
        raise Unavailable(f"{name}: the topic's revision is not in the metadata mirror yet")
    retired = retired_name(table, state.topic)
    await call("retire", retired)
    log.warning(
        "%s: its table held a deleted topic's rows (revision %d, this topic's %d): kept as %s; a new table "
        "begins", name, state.topic, revision, retired,
    )  # fmt: skip
    return True


__all__ = [
    "OrphanSweeper",
    "follow_incarnation",
    "nap",
    "orphan_files_deleted",
    "orphan_sweeps",
    "retired_name",
    "topic_revision",
]
