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
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

from ister.cluster import metrics as cluster_metrics
from ister.cluster.assigner import Assigner
from ister.cluster.balancer import Balancer
from ister.cluster.guard import OwnershipGuard
from ister.cluster.load_report import LoadReporter
from ister.cluster.membership import LeaseClock, Membership, load_broker_id
from ister.cluster.view import ClusterView
from ister.config import BrokerConfig
from ister.core.cluster.assignment import Marker
from ister.core.cluster.moves import Code, MoveFailure, next_failure
from ister.core.cluster.ownership import OwnerRecord
from ister.core.cluster.planner import ClusterState
from ister.errors import FailedPrecondition, IsterError, MetadataError, Unavailable
from ister.metadata import keys
from ister.metadata.cache import LocalCache
from ister.metadata.records import BrokerRegistration
from ister.metadata.store import Compare, Delete, KeyValue, MetadataStore, Op, Put
from ister.ports.host import TopicHost
from ister.slow_steps import warn_if_slow
from ister.tasks import TaskSupervisor

log = logging.getLogger(__name__)

SWEEP_SECONDS = 1.0  # re-check even without a change (lease clocks, retries after failed writes)
# A load of an assigned topic still running after this is logged with where it waits (no second load of the
# topic starts meanwhile, so a hung one would otherwise keep the topic unserved without a word).
SLOW_LOAD_SECONDS = 10.0
LOAD_CONCURRENCY = 8


UNLOAD_POLL_SECONDS = 0.1  # how often an admin unload checks for the owner's answer


class ClusterNode:
    def __init__(self, config: BrokerConfig, store: MetadataStore, data_dir: Path) -> None:
        self.config = config
        self.store = store
        self.broker_id = load_broker_id(data_dir)
        self.cache = LocalCache(
            store,
            [
                keys.CLUSTER_PREFIX,
                keys.OWNERS_PREFIX,
                keys.MOVE_FAILURES_PREFIX,
                keys.REPLICAS_PREFIX,
                keys.ABSENT_BROKERS_PREFIX,
            ],
        )
        self.view = ClusterView(self.cache)
        self.membership = Membership(config, store, self.broker_id, self._lease_lost)
        self.reporter = LoadReporter(self.broker_id, durable_tier=config.durable_url(data_dir) is not None)
        self.balancer = Balancer(self)
        self.assigner = Assigner(self)  # the leader's assignment pass
        # (topic, records appended, bytes appended) of each follower copy kept here, for the load report.
        self.followed: Callable[[], Iterable[tuple[str, int, int]]] = tuple
        self.guards: dict[str, OwnershipGuard] = {}
        self._host: TopicHost | None = None
        self._tasks = TaskSupervisor("cluster node")  # its loops and the topic loads in progress
        self._loading: dict[str, asyncio.Task[None]] = {}
        self._load_slots = asyncio.Semaphore(LOAD_CONCURRENCY)
        self._mine: set[str] = set()  # topics assigned to this broker
        self._mine_feed = self.cache.feed(keys.broker_topics_prefix(self.broker_id))
        self._owners_feed = self.cache.feed(keys.OWNERS_PREFIX)
        self._swept = 0.0
        self._markers_feed = self.cache.feed(keys.UNASSIGNED_PREFIX)

    @property
    def clock(self) -> LeaseClock:
        return self.membership.clock

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
    def assigned_here(self, topic: str) -> bool:
        return self.cache.get(keys.broker_topic(self.broker_id, topic)) is not None

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

    # -- claiming a topic (called by the broker service while loading) -------------------------------------
    async def read_owner(self, topic: str, *, fresh: bool = False) -> tuple[OwnerRecord, tuple[int, int]]:
        """The owner record and the versions (record, assignment key) a claim compares.

        From the cache when it has both (a stale pair only makes the claim's compare fail: the caller then
        asks again with `fresh=True`), else from the store. Unavailable unless the record names this broker
        and its assignment key exists.
        """
        kv = None if fresh else self.cache.get(keys.owner(topic))
        assignment = None if fresh else self.cache.get(keys.broker_topic(self.broker_id, topic))
        if kv is None or assignment is None:
            kv = await self.store.get(keys.owner(topic))
            assignment = await self.store.get(keys.broker_topic(self.broker_id, topic))
        record = OwnerRecord.parse(kv.value) if kv is not None else None
        if kv is None or record is None or record.broker_id != self.broker_id:
            raise Unavailable(f"topic {topic} is not assigned to this broker; redo the lookup")
        if assignment is None:
            raise Unavailable(f"topic {topic} is being reassigned; redo the lookup")
        return record, (kv.version, assignment.version)

    async def commit_claim(
        self, topic: str, versions: tuple[int, int], record: OwnerRecord
    ) -> OwnershipGuard:
        """Write the loading owner's record and return the guard that fences the topic.

        Compares the record and the assignment key as read: a failover that deleted the assignment meanwhile
        (it leaves the record alone) makes the claim fail instead of producing a second writer.
        """
        self.clock_check(topic)
        key = keys.owner(topic)
        ok = await self.store.txn(
            [Compare(key, versions[0]), Compare(keys.broker_topic(self.broker_id, topic), versions[1])],
            [Put(key, record.to_json())],
        )
        if not ok:
            raise Unavailable(f"topic {topic} was reassigned while loading; redo the lookup")
        kv = await self.store.get(key)
        if kv is None or OwnerRecord.parse(kv.value) != record:
            raise Unavailable(f"topic {topic} was reassigned while loading; redo the lookup")
        guard = OwnershipGuard(
            topic, self.store, self.clock, record, kv.version, self.config.cluster.offset_reservation
        )
        old = self.guards.pop(topic, None)
        if old is not None:
            old.revoke("reloaded")
        self.guards[topic] = guard
        return guard

    def clock_check(self, topic: str) -> None:
        if not self.clock.valid():
            raise Unavailable(f"topic {topic}: this broker cannot renew its lease right now")

    def forget(self, topic: str) -> None:
        guard = self.guards.pop(topic, None)
        if guard is not None:
            guard.revoke("unloaded")

    # -- watcher: load what is assigned here, drop what was taken away --------------------------------------
    async def _watch_once(self) -> None:
        """Per change, look only at what changed: this broker's assignments and the owner records of its
        topics. Everything is re-checked once per SWEEP_SECONDS too (retries after failed hand-offs)."""
        host = self._host
        assert host is not None
        reset, added, suspects = self._assignment_changes()
        owners_reset, owners_changed = self._owners_feed.drain()
        for key in owners_changed:
            if (topic := keys.owner_topic_from_key(key)) is not None and topic in self.guards:
                suspects.add(topic)
        now = time.monotonic()
        sweep = reset or owners_reset or now - self._swept >= SWEEP_SECONDS
        if sweep:
            self._swept = now
        for topic in list(self.guards) if sweep else sorted(suspects & self.guards.keys()):
            await self._recheck_guard(topic)
        await self._answer_unload_markers(sweep)
        if not self.clock.valid():
            return  # do not claim anything while the lease may be gone
        mine = self._mine
        for topic in sorted(mine if sweep else added & mine):
            if topic not in self._loading and not host.is_loaded(topic):
                self._loading[topic] = self._tasks.spawn(self._load(topic), f"load {topic}")

    def _assignment_changes(self) -> tuple[bool, set[str], set[str]]:
        """Apply the changes of this broker's assignment keys to `_mine`: (whether the feed was reset,
        topics assigned here, loaded topics whose assignment went away)."""
        reset, changed = self._mine_feed.drain()
        added: set[str] = set()
        suspects: set[str] = set()
        if reset:
            prefix = keys.broker_topics_prefix(self.broker_id)
            self._mine = {
                t
                for kv in self.cache.list(prefix)
                if (t := keys.broker_topic_from_key(kv.key, self.broker_id))
            }
        for key in changed:
            topic = keys.broker_topic_from_key(key, self.broker_id)
            if topic is None:
                continue
            if self.cache.get(key) is None:
                self._mine.discard(topic)
                suspects.add(topic)
            else:
                self._mine.add(topic)
                added.add(topic)
        return reset, added, suspects

    async def _recheck_guard(self, topic: str) -> None:
        """A topic loaded here: hand it off when a move asks for it, release it when it was taken away."""
        guard = self.guards.get(topic)
        if guard is None:
            return
        kv = self.cache.get(keys.owner(topic))
        record = OwnerRecord.parse(kv.value) if kv is not None else None
        if topic not in self._mine:
            marker_kv = self.cache.get(keys.unassigned(topic))
            if marker_kv is not None and self._unload_marker(topic) is not None:
                await self._hand_off(topic, marker_kv)  # a move: seal, then let the leader reassign
            else:
                await self._release(topic, "assignment removed")
        elif record is not None and record.epoch > guard.epoch:
            await self._release(topic, f"reassigned at epoch {record.epoch}")

    async def _answer_unload_markers(self, sweep: bool) -> None:
        """Unload markers for topics not loaded here (rare): the changed ones now, all of them on a sweep."""
        markers_reset, markers_changed = self._markers_feed.drain()
        if sweep or markers_reset:
            marker_kvs = self.cache.list(keys.UNASSIGNED_PREFIX)
        else:
            marker_kvs = [kv for key in sorted(markers_changed) if (kv := self.cache.get(key)) is not None]
        for kv in marker_kvs:
            value = kv.value  # cheap test first: most markers are new topics (null)
            if not (isinstance(value, dict) and value.get("from_broker") == self.broker_id):
                continue
            waiting = keys.unassigned_topic_from_key(kv.key)
            if (
                waiting is not None
                and waiting not in self._mine
                and waiting not in self.guards
                and self._unload_marker(waiting) is not None
            ):
                await self._hand_off(waiting, kv)  # not loaded here: nothing to seal, just say ready

    async def _load(self, topic: str) -> None:
        host = self._host
        assert host is not None
        try:
            async with self._load_slots:
                if self.assigned_here(topic):
                    with warn_if_slow(f"loading assigned topic {topic}", SLOW_LOAD_SECONDS):
                        await host.load_assigned(topic)
        except IsterError as exc:
            log.warning("loading assigned topic %s failed: %s", topic, exc)
        except Exception:
            log.exception("loading assigned topic %s failed", topic)
        finally:
            self._loading.pop(topic, None)

    def _unload_marker(self, topic: str) -> Marker | None:
        """The pending unload marker that asks this broker to seal the topic, if any."""
        kv = self.cache.get(keys.unassigned(topic))
        if kv is None:
            return None
        marker = Marker.parse(kv.value)
        if marker.reason == "unload" and marker.from_broker == self.broker_id and not marker.ready:
            return marker
        return None

    async def _hand_off(self, topic: str, marker_kv: KeyValue) -> None:
        """Seal the topic (if loaded here), then tell the leader it may assign it elsewhere (`ready`).

        A seal that fails leaves the topic here: the assignment is put back, the marker removed and the
        cause recorded (`/ister/move-failures/...`) for the admin who asked and the load manager's backoff.
        """
        host = self._host
        assert host is not None
        try:
            await host.seal(topic, "unload")
        except Exception as exc:
            cause = str(exc) if isinstance(exc, IsterError) else repr(exc)
            code: Code = "failed_precondition" if isinstance(exc, FailedPrecondition) else "unavailable"
            if await self._keep_after_failed_move(topic, marker_kv, cause, code):
                return
            # The marker changed under us (the topic was deleted or re-requested): nothing to put back. The
            # next owner starts at the reservation end; this broker's WAL is exported when it can be.
            log.warning("sealing %s for its move failed (%s); releasing it unsealed", topic, cause)
            await self._release(topic, "unsealed move")
        self.guards.pop(topic, None)
        pending = Marker.parse(marker_kv.value)
        ready = Marker(
            reason="unload", from_broker=self.broker_id, to_broker=pending.to_broker, ready=True
        ).to_json()
        ops: list[Op] = [Put(marker_kv.key, ready)]
        if self.cache.get(keys.move_failure(topic)) is not None:
            ops.append(Delete(keys.move_failure(topic)))
        if await self.store.txn([Compare(marker_kv.key, marker_kv.version)], ops):
            log.info("handed off %s", topic)

    async def _keep_after_failed_move(self, topic: str, marker_kv: KeyValue, cause: str, code: Code) -> bool:
        """Undo a requested move whose seal failed: the assignment comes back, the marker goes, the cause
        is recorded. False when the marker changed meanwhile (then nothing is written)."""
        previous_kv = self.cache.get(keys.move_failure(topic))
        previous = MoveFailure.parse(previous_kv.value) if previous_kv is not None else None
        note = next_failure(previous, self.broker_id, cause, code, time.time())
        assignment = keys.broker_topic(self.broker_id, topic)
        ok = await self.store.txn(
            [Compare(marker_kv.key, marker_kv.version), Compare(assignment, None)],
            [Put(assignment, None), Delete(marker_kv.key), Put(keys.move_failure(topic), note.to_json())],
        )
        if not ok:
            return False
        if not self._host_loaded(topic):
            self.guards.pop(topic, None)  # sealed half-way: the watcher loads it again from its WAL
        cluster_metrics.failed_moves.inc()
        log.warning(
            "%s stays on broker %d: its move failed (%d in a row): %s",
            topic,
            self.broker_id,
            note.failures,
            cause,
        )
        return True

    def _host_loaded(self, topic: str) -> bool:
        return self._host is not None and self._host.is_loaded(topic)

    async def _release(self, topic: str, reason: str) -> None:
        guard = self.guards.pop(topic, None)
        if guard is not None:
            guard.revoke(reason)  # fence first: no append lands after this line
        if self._host is not None:
            await self._host.unload(topic, reason)

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
