"""A cluster node's watcher (node.py): topics assigned here are loaded, topics taken away (assignment gone,
newer epoch) are fenced at once and unloaded, and unload requests are answered by handing the topic off."""

from __future__ import annotations

import logging
import time

from ister.cluster import metrics as cluster_metrics
from ister.cluster.node_base import NodeBase
from ister.core.cluster.assignment import Marker
from ister.core.cluster.moves import Code, MoveFailure, next_failure
from ister.core.cluster.ownership import OwnerRecord
from ister.errors import FailedPrecondition, IsterError
from ister.metadata import keys
from ister.metadata.store import Compare, Delete, KeyValue, Op, Put
from ister.slow_steps import warn_if_slow

log = logging.getLogger(__name__)

SWEEP_SECONDS = 1.0  # re-check even without a change (lease clocks, retries after failed writes)
# A load of an assigned topic still running after this is logged with where it waits (no second load of the
# topic starts meanwhile, so a hung one would otherwise keep the topic unserved without a word).
SLOW_LOAD_SECONDS = 10.0


class NodeWatcher(NodeBase):
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
