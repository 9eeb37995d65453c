"""`ClusterView`: the `/cluster/` state the leader plans from, kept up to date per changed key.

Re-reading the whole prefix on every metadata change made the leader's pass O(topics) per change (and a
burst of N new topics O(N^2)); the view applies only the keys a `ChangeFeed` reports, parsing each key
once, and rebuilds from the cache only after a re-list.
"""

from __future__ import annotations

from ister.core.cluster.assignment import Marker
from ister.core.cluster.planner import ClusterState
from ister.metadata import keys
from ister.metadata.cache import LocalCache
from ister.metadata.store import KeyValue


class ClusterView:
    def __init__(self, cache: LocalCache) -> None:
        self._cache = cache
        self._feed = cache.feed(keys.CLUSTER_PREFIX)
        self.live: set[int] = set()  # registered brokers
        self.modes: dict[int, str] = {}  # broker -> mode from its state key
        self.assignment_kvs: dict[str, KeyValue] = {}  # topic -> its assignment key
        self.assignments: dict[str, int] = {}  # topic -> owner
        self.owned: dict[int, int] = {}  # broker -> number of topics assigned to it
        self.unassigned_kvs: dict[str, KeyValue] = {}  # topic -> its marker key
        self.markers: dict[str, Marker] = {}  # topic -> parsed marker

    def refresh(self) -> None:
        reset, changed = self._feed.drain()
        if reset:
            for table in (self.modes, self.assignment_kvs, self.assignments, self.owned):
                table.clear()
            self.live.clear()
            self.unassigned_kvs.clear()
            self.markers.clear()
            changed = {kv.key for kv in self._cache.list(keys.CLUSTER_PREFIX)}
        for key in sorted(changed):  # sorted: a topic briefly assigned twice resolves as a listing would
            self._apply(key, self._cache.get(key))

    def state(self) -> ClusterState:
        """A copy the planner may change (the leader overlays its own recent assignments on it)."""
        self.refresh()
        return ClusterState(
            live=set(self.live),
            assignments=dict(self.assignments),
            unassigned=dict(self.markers),
            modes=dict(self.modes),
        )

    def has_orphans(self) -> bool:
        """Whether any assignment points at an unregistered broker (cheap: per broker, not per topic)."""
        return any(broker not in self.live for broker, n in self.owned.items() if n)

    def _apply(self, key: str, kv: KeyValue | None) -> None:
        if key.startswith(keys.REGISTER_PREFIX):
            for broker_id in keys.broker_ids([key]):  # the same parsing as everywhere else: 0 or 1 id
                (self.live.add if kv is not None else self.live.discard)(broker_id)
        elif key.startswith(keys.BROKERS_PREFIX):
            parts = key[len(keys.BROKERS_PREFIX) :].split("/")
            if not parts[0].isdigit():
                return
            broker = int(parts[0])
            if len(parts) == 2 and parts[1] == keys.BROKER_STATE:
                value = kv.value if kv is not None else None
                if isinstance(value, dict) and isinstance(value.get("mode"), str):
                    self.modes[broker] = value["mode"]
                else:
                    self.modes.pop(broker, None)
            elif len(parts) == 3 and parts[1] and parts[2]:
                self._assignment(f"/{parts[1]}/{parts[2]}", broker, key, kv)
        elif key.startswith(keys.UNASSIGNED_PREFIX):
            topic = keys.unassigned_topic_from_key(key)
            if topic is None:
                return
            if kv is None:
                self.unassigned_kvs.pop(topic, None)
                self.markers.pop(topic, None)
            else:
                self.unassigned_kvs[topic] = kv
                self.markers[topic] = Marker.parse(kv.value)

    def _assignment(self, topic: str, broker: int, key: str, kv: KeyValue | None) -> None:
        current = self.assignment_kvs.get(topic)
        if kv is None:
            if current is None or current.key != key:
                return  # another broker's key for the topic is the one in force
            del self.assignment_kvs[topic]
            del self.assignments[topic]
            self.owned[broker] -= 1
            # Another broker's key for the topic may still exist (a move's old key not yet deleted).
            for other in sorted(self.owned):
                other_kv = self._cache.get(f"{keys.BROKERS_PREFIX}{other}{topic}")
                if other_kv is not None:
                    self._assignment(topic, other, other_kv.key, other_kv)
                    return
            return
        if current is not None:
            previous = self.assignments[topic]
            self.owned[previous] -= 1
        self.assignment_kvs[topic] = kv
        self.assignments[topic] = broker
        self.owned[broker] = self.owned.get(broker, 0) + 1
