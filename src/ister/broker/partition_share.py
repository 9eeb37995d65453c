"""Cluster mode: the partition groups of one partitioned topic's Failover subscription, on every broker that
serves some of its partitions, assigned as one group (docs/architecture.md, "Partition groups across
brokers").

Each broker writes, under its lease, which consumer names are attached on each partition it serves
(`/ister/partition-groups/{ns}/{topic}/{sub}/members/{broker_id}`). The broker serving partition 0 is the
group's coordinator: from every broker's report it computes the members (the names attached on every
partition), rebalances them (balanced, sticky, after `rebalance_delay`; at once when an assigned consumer
is gone) and writes the partition -> consumer map (`.../assignment`, under its lease). Every owner follows
that map for the partitions it serves, with the same local graceful handoff as in standalone mode: a
partition's handoff only involves the broker that serves it. The official client names all its
per-partition consumers alike, so a consumer is its name on every broker.

`SharedGroups` holds what the store says (one watch on the prefix, re-listed when it lags) and writes this
broker's keys from one writer task: the partition groups' tick is synchronous and only states what it wants
written; the writer writes the newest value of each key and rewrites them all under a new lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from ister.errors import MetadataError, WatchLagged
from ister.ids import PARTITION_MARKER
from ister.metadata import keys
from ister.metadata.store import MetadataStore, list_all
from ister.tasks import TaskSupervisor

log = logging.getLogger(__name__)

RETRY_SECONDS = 0.5
_DELETE = object()


def _members_value(view: dict[int, list[str]]) -> dict[str, list[str]]:
    return {str(p): names for p, names in sorted(view.items())}


def _assignment_value(mapping: dict[int, str]) -> dict[str, str]:
    return {str(p): name for p, name in sorted(mapping.items())}


class SharedGroups:
    def __init__(self, store: MetadataStore, broker_id: int, lease: Callable[[], int | None]) -> None:
        self.store = store
        self.broker_id = broker_id
        self._lease = lease
        # (base, sub) -> broker id -> partition -> names; (base, sub) -> partition -> name
        self.reports: dict[tuple[str, str], dict[int, dict[int, frozenset[str]]]] = {}
        self.assignments: dict[tuple[str, str], dict[int, str]] = {}
        self.partition_counts: dict[str, int] = {}
        self._counting: set[str] = set()
        self._want: dict[str, Any] = {}  # key -> value (or _DELETE) this broker wants stored
        self._stored: dict[str, Any] = {}  # key -> value as last written under `_stored_lease`
        self._stored_lease: int | None = None
        self._wake = asyncio.Event()
        self._tasks = TaskSupervisor("partition groups")  # its loops and the partition counts being read

    def start(self) -> None:
        self._tasks.spawn(self._watch(), "partition-groups-watch")
        self._tasks.spawn(self._write(), "partition-groups-write")

    async def close(self) -> None:
        await self._tasks.close()

    # -- what the partition groups read ---------------------------------------------------------------------
    def partitions(self, base: str) -> int | None:
        """The partitioned topic's partition count (read once from the namespace's topic list), None until
        known."""
        n = self.partition_counts.get(base)
        if n is None and base not in self._counting and not self._tasks.closed:
            self._counting.add(base)
            self._tasks.spawn(self._count(base), f"partition-count:{base}")
        return n

    async def _count(self, base: str) -> None:
        prefix = keys.namespace_topic(base) + PARTITION_MARKER  # a partitioned topic is its partitions
        try:
            found = [kv.key[len(prefix) :] for kv in await self.store.list(prefix)]
            indexes = sorted(int(i) for i in found if i.isdigit())
            if indexes and indexes == list(range(len(indexes))):
                self.partition_counts[base] = len(indexes)
        except MetadataError as exc:
            log.warning("partition count of %s: %s", base, exc)
        finally:
            self._counting.discard(base)

    def members_view(self, base: str, sub: str) -> dict[int, frozenset[str]]:
        """partition -> attached names, over every broker's report (this broker's from the store too)."""
        out: dict[int, frozenset[str]] = {}
        for view in self.reports.get((base, sub), {}).values():
            out.update(view)
        return out

    def assignment(self, base: str, sub: str) -> dict[int, str] | None:
        return self.assignments.get((base, sub))

    # -- what the partition groups write --------------------------------------------------------------------
    def publish_members(self, base: str, sub: str, view: dict[int, list[str]]) -> None:
        key = keys.partition_group_members(base, sub, self.broker_id)
        self._set(key, _members_value(view) if view else _DELETE)

    def publish_assignment(self, base: str, sub: str, mapping: dict[int, str]) -> None:
        key = keys.partition_group_assignment(base, sub)
        self._set(key, _assignment_value(mapping))
        self.assignments[(base, sub)] = dict(mapping)  # followed here at once, without the round trip

    def forget_assignment(self, base: str, sub: str) -> None:
        """This broker no longer coordinates the group: the key is left to the new coordinator (who starts
        from it), and never written from here again (not even under a new lease)."""
        key = keys.partition_group_assignment(base, sub)
        self._want.pop(key, None)
        self._stored.pop(key, None)

    def _set(self, key: str, value: Any) -> None:
        if key in self._want:
            if self._want[key] == value:
                return
        elif (self._stored.get(key, _DELETE) == value) if key in self._stored else value is _DELETE:
            return
        self._want[key] = value
        self._wake.set()

    async def _write(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):  # also a look at the lease every second
                await asyncio.wait_for(self._wake.wait(), 1.0)
            self._wake.clear()
            lease = self._lease()
            if lease is None:
                await asyncio.sleep(RETRY_SECONDS)
                self._wake.set()
                continue
            if lease != self._stored_lease:  # a new lease: every key of ours is gone with the old one
                for key, value in self._stored.items():
                    self._want.setdefault(key, value)
                self._stored, self._stored_lease = {}, lease
            try:
                for key, value in list(self._want.items()):
                    if value is _DELETE:
                        if key in self._stored:
                            await self.store.delete(key)
                            del self._stored[key]
                        if self._want.get(key) is value:
                            del self._want[key]
                    elif self._stored.get(key) != value:
                        await self.store.put(key, value, lease=lease)
                        self._stored[key] = value
            except MetadataError as exc:
                log.warning("writing partition group keys: %s; retrying", exc)
                await asyncio.sleep(RETRY_SECONDS)
                self._wake.set()

    # -- what the store says --------------------------------------------------------------------------------
    async def _watch(self) -> None:
        while True:
            try:
                watch = self.store.watch(keys.PARTITION_GROUPS_PREFIX)
                async with watch:
                    self.reports, self.assignments = {}, {}
                    for kv in await list_all(self.store, keys.PARTITION_GROUPS_PREFIX):
                        self._apply(kv.key, kv.value)
                    async for event in watch:
                        self._apply(event.key, event.value if event.kind == "put" else None)
            except WatchLagged:
                continue  # re-list and watch again
            except MetadataError as exc:
                log.warning("watching partition groups: %s; retrying", exc)
                await asyncio.sleep(RETRY_SECONDS)

    def _apply(self, key: str, value: Any) -> None:
        parsed = keys.partition_group_from_key(key)
        if parsed is None:
            return
        base, sub, kind, broker = parsed
        group = (base, sub)
        try:
            if kind == "assignment":
                if value is None:
                    self.assignments.pop(group, None)  # the coordinator went: keep following the last map
                else:
                    self.assignments[group] = {int(p): str(n) for p, n in dict(value).items()}
            elif broker is not None:
                reports = self.reports.setdefault(group, {})
                if value is None:
                    reports.pop(broker, None)
                else:
                    reports[broker] = {int(p): frozenset(map(str, n)) for p, n in dict(value).items()}
        except (TypeError, ValueError):
            log.warning("ignoring a malformed partition group key %s", key)
