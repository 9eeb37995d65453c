"""`ClusterNode`: one broker's part in the cluster.

* membership: registration under a lease, kept alive; the lease clock fences this broker's topics;
* election: `/cluster/leader` created under the lease with a compare-and-set; whoever holds it leads;
* the leader's assigner (cluster/assigner.py): dead brokers' topics become unassigned, unassigned topics
  get owners (Fair, round-robin among near-equal brokers), each assignment bumping the topic's epoch in
  one transaction;
* the watcher: topics assigned here are loaded; topics taken away (assignment gone, newer epoch) are
  fenced at once and unloaded.

Every decision reads the LocalCache (fed by watches); every write is a transaction guarded by what the
decision was based on, so a stale cache or a deposed leader can only cause a failed write, never a
second owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from ister.cluster import metrics as cluster_metrics
from ister.cluster.assigner import Assigner
from ister.cluster.balancer import Balancer
from ister.cluster.membership import Membership
from ister.cluster.node_watch import SWEEP_SECONDS, NodeWatcher
from ister.config import BrokerConfig
from ister.core.cluster.assignment import Marker
from ister.core.cluster.moves import MoveFailure
from ister.core.cluster.ownership import OwnerRecord
from ister.core.cluster.planner import ClusterState
from ister.errors import FailedPrecondition, MetadataError, Unavailable
from ister.metadata import keys
from ister.metadata.records import BrokerRegistration
from ister.metadata.store import Compare, Delete, KeyValue, MetadataStore, Put
from ister.ports.host import TopicHost

log = logging.getLogger(__name__)

UNLOAD_POLL_SECONDS = 0.1  # how often an admin unload checks for the owner's answer


class ClusterNode(NodeWatcher):
    """One broker's part in the cluster (see the module docstring)."""

    def __init__(self, config: BrokerConfig, store: MetadataStore, data_dir: Path) -> None:
        super().__init__(config, store, data_dir)
        self.membership = Membership(config, store, self.broker_id, self._lease_lost)
        self.balancer = Balancer(self)
        self.assigner = Assigner(self)  # the leader's assignment pass

    # -- lifecycle ---------------------------------------------------------------------------------------
    async def start(self, host: TopicHost) -> None:
        self._host = host
        await self.cache.start()
        await self.store.put(keys.cluster_name(self.config.cluster_name), None)
        await self.membership.register()
        self.membership.start()
        self._tasks.spawn(self._run("leader", self._lead_once), "cluster leader")
        self._tasks.spawn(self._run("watcher", self._watch_once), "cluster watcher")
        self._tasks.spawn(self._report_loop(), "cluster load reports")
        self._tasks.spawn(self.assignments.follow(), "assignment index")

    async def close(self) -> None:
        await self._tasks.close()
        await self.membership.close()
        await self.cache.close()

    async def _run(self, what: str, step: Callable[[], Awaitable[None]]) -> None:
        while True:
            changed = self.cache.change_event()
            try:
                await step()
            except (MetadataError, TimeoutError) as exc:
                log.warning("cluster %s step failed: %s", what, exc)
            except Exception:
                log.exception("cluster %s step failed", what)
            # Not asyncio.wait_for: on 3.11 it can swallow a cancellation that races the event being set.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SWEEP_SECONDS):
                    await changed.wait()

    async def _report_loop(self) -> None:
        """Write this broker's load report every `load_report_interval_seconds` (the first at once)."""
        interval = self.config.load_manager.load_report_interval_seconds
        while True:
            host = self._host
            try:
                if host is not None:
                    report = self.reporter.report(host.load_snapshot(), followed=self.followed())
                    bid = str(self.broker_id)
                    usage = {r["resource"]: r["usage"] for r in report["resources_usage"]}
                    cluster_metrics.cpu_usage.labels(bid).set(usage.get("CPU", 0.0) / 100)
                    cluster_metrics.memory_usage.labels(bid).set(usage.get("Memory", 0.0) / 100)
                    await self.store.put(keys.load_report(self.broker_id), report)
            except (MetadataError, TimeoutError) as exc:
                log.warning("writing the load report failed: %s", exc)
            except Exception:
                log.exception("building the load report failed")
            await asyncio.sleep(interval)

    async def _lease_lost(self) -> None:
        for topic in list(self.guards):
            await self._release(topic, "lease lost")
        self.assigner.leader_since = None
        await self.membership.register()

    # -- reads for the broker service ----------------------------------------------------------------------
    def owner_of(self, topic: str) -> int | None:
        """The broker the topic is assigned to (its owner record), None while unassigned."""
        kv = self.cache.get(keys.owner(topic))
        record = OwnerRecord.parse(kv.value) if kv is not None else None
        if record is None:
            return None
        if self.cache.get(keys.broker_topic(record.broker_id, topic)) is None:
            return None  # orphaned or moving: the assignment key is the authority
        return record.broker_id

    def url_of(self, broker_id: int) -> str | None:
        kv = self.cache.get(keys.broker_register(broker_id))
        reg = BrokerRegistration.parse(kv.value) if kv is not None else None
        return reg.url or None if reg is not None else None

    def leader(self) -> int | None:
        kv = self.cache.get(keys.LEADER)
        return kv.value if kv is not None and isinstance(kv.value, int) else None

    def not_loaded_here(self) -> list[str]:
        """Topics assigned to this broker that it has not loaded (yet), sorted (readiness)."""
        host = self._host
        return sorted(t for t in self._mine if host is None or not host.is_loaded(t))

    def live_brokers(self) -> list[int]:
        self.view.refresh()
        return sorted(self.view.live)

    async def request_assignment(self, topic: str) -> None:
        """Queue a topic for the leader (`/cluster/unassigned/...`), unless it is assigned or queued."""
        key = keys.unassigned(topic)
        if self.owner_of(topic) is None and self.cache.get(key) is None:
            # Also compare the owner record as seen: a lagging cache must not queue an assigned topic.
            seen = self.cache.get(keys.owner(topic))
            owner_key = keys.owner(topic)
            await self.store.txn(
                [Compare(key, None), Compare(owner_key, seen.version if seen is not None else None)],
                [Put(key, None)],
            )

    async def request_unload(self, topic: str, *, wait_seconds: float = 0.0) -> None:
        """Move a topic away from its owner: the owner seals it, then the leader assigns it elsewhere.

        One transaction deletes the assignment and writes `{"reason":"unload","from_broker":owner,
        "ready":false}`; the owner's watcher seals and flips `ready` to true (docs/architecture.md §12,
        "Unload / move"). With `wait_seconds`, waits for the owner's answer and raises its cause when it could
        not seal the topic (FailedPrecondition: not possible as configured; Unavailable: try again later).
        """
        owner = self.owner_of(topic)
        if owner is None:
            raise Unavailable(f"topic {topic} has no owner right now (being assigned); retry")
        if len([b for b in self.live_brokers() if b != owner]) < 1:
            raise FailedPrecondition(f"cannot unload {topic}: no other live broker to take it")
        assignment = self.cache.get(keys.broker_topic(owner, topic))
        if assignment is None:
            raise Unavailable(f"topic {topic} is moving; retry")
        marker = keys.unassigned(topic)
        before = await self.store.get(keys.move_failure(topic)) if wait_seconds > 0 else None
        ok = await self.store.txn(
            [Compare(assignment.key, assignment.version), Compare(marker, None)],
            [
                Delete(assignment.key),
                Put(marker, Marker(reason="unload", from_broker=owner, ready=False).to_json()),
            ],
        )
        if not ok:
            raise Unavailable(f"topic {topic} is moving; retry")
        log.info("unload of %s from broker %d requested", topic, owner)
        if wait_seconds > 0:
            await self._wait_unload(topic, owner, before.version if before else None, wait_seconds)

    async def _wait_unload(
        self, topic: str, owner: int, note_before: int | None, wait_seconds: float
    ) -> None:
        """Until the owner answered the unload: the marker flipped to ready or was taken by the leader
        (moved), or it is gone with a newer failure note (kept). Reads the store, not the cache: a lagging
        cache would show the marker as gone before it ever saw it."""
        marker = keys.unassigned(topic)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_seconds
        while True:
            kv = await self.store.get(marker)
            if kv is not None and Marker.parse(kv.value).ready:
                return  # sealed: the leader assigns it elsewhere
            if kv is None:
                break
            if loop.time() >= deadline:
                raise Unavailable(
                    f"unload of {topic} requested, but broker {owner} has not sealed it within "
                    f"{wait_seconds:.0f} s; it moves once it has"
                )
            await asyncio.sleep(UNLOAD_POLL_SECONDS)
        note_kv = await self.store.get(keys.move_failure(topic))
        if note_kv is None or (note_before is not None and note_kv.version <= note_before):
            return  # moved (a successful hand-off deletes the note)
        note = MoveFailure.parse(note_kv.value)
        if note is not None:
            error = FailedPrecondition if note.code == "failed_precondition" else Unavailable
            raise error(note.cause)

    async def wait_owner(self, topic: str, seconds: float) -> int | None:
        await self.cache.wait_for(lambda: self.owner_of(topic) is not None, seconds)
        return self.owner_of(topic)

    # -- leader ---------------------------------------------------------------------------------------------
    async def _lead_once(self) -> None:
        leader = self.cache.get(keys.LEADER)
        if leader is None:
            if self.membership.lease_id is not None and self.clock.valid():
                won = await self.store.compare_and_set(
                    keys.LEADER, self.broker_id, expected_version=None, lease=self.membership.lease_id
                )
                if won:
                    log.info("broker %d is the cluster leader", self.broker_id)
            return
        if leader.value != self.broker_id or not self.clock.valid():
            self.assigner.leader_since = None
            return
        if self.assigner.leader_since is None:
            self.assigner.leader_since = time.monotonic()
        await self.assigner.assign(leader)
        await self.balancer.step(leader)

    def snapshot(self) -> tuple[ClusterState, dict[str, KeyValue], dict[str, KeyValue]]:
        """The cluster as the cache shows it: state (a copy to plan on), assignment and marker entries."""
        state = self.view.state()
        return state, dict(self.view.assignment_kvs), dict(self.view.unassigned_kvs)
