"""Choosing a broker for a topic (the Fair strategy, docs/architecture.md §13) with round-robin among
near-equal brokers.

Scores are integers (topic counts for Fair); lower is better. The brokers within the round-robin threshold
of the lowest score take turns, so a burst of new topics spreads evenly instead of piling onto the broker
that happened to be lightest when the burst began.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

Rankings = list[tuple[int, int]]  # (broker_id, score), best first


def fair_rankings(topic_counts: Mapping[int, int]) -> Rankings:
    """Brokers by topic count, ties broken by id so every leader computes the same order."""
    return sorted(topic_counts.items(), key=lambda item: (item[1], item[0]))


def round_robin_threshold(lowest: int) -> int:
    """Scores up to this are 'near-equal' to the lowest: exact below 10, else within 10 % (at least 1)."""
    return lowest if lowest < 10 else lowest + max(lowest // 10, 1)


@dataclass(frozen=True, slots=True)
class Marker:
    """The value of `/cluster/unassigned/{ns}/{topic}`: why the topic waits for an owner."""

    reason: str | None = None  # None: new topic; "failover", "unload", "rebalance", "drain_redirect"
    from_broker: int | None = None
    to_broker: int | None = None
    ready: bool = True  # an unload marker waits until the old owner has sealed the topic

    @classmethod
    def parse(cls, value: Any) -> Marker:
        """Lenient: anything unrecognised is a plain 'assign me' marker, as Danube treats it."""
        if not isinstance(value, dict):
            return cls()

        def broker(key: str) -> int | None:
            v = value.get(key)
            return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None

        reason = value.get("reason")
        ready = value.get("ready", True)
        return cls(
            reason=reason if isinstance(reason, str) else None,
            from_broker=broker("from_broker"),
            to_broker=broker("to_broker"),
            ready=ready if isinstance(ready, bool) else True,
        )

    def to_json(self) -> dict[str, Any] | None:
        if self.reason is None:
            return None
        out: dict[str, Any] = {"reason": self.reason}
        if self.from_broker is not None:
            out["from_broker"] = self.from_broker
        if self.to_broker is not None:
            out["to_broker"] = self.to_broker
        if self.reason == "unload":
            out["ready"] = self.ready
        return out


class BrokerSelector:
    """Picks owners; remembers the last pick to rotate among near-equal brokers."""

    def __init__(self) -> None:
        self.last: int | None = None

    def choose(self, rankings: Rankings, active: Collection[int], marker: Marker | None = None) -> int | None:
        """The broker for one topic, or None when it must wait (no active broker, unsealed unload)."""
        marker = marker or Marker()
        ranked_active = [b for b, _ in rankings if b in active]
        if marker.reason == "unload":
            if not marker.ready:
                return None
            # A rebalancing move names its target; otherwise anywhere but back where it came from.
            if (
                marker.to_broker is not None
                and marker.to_broker in active
                and marker.to_broker != marker.from_broker
            ):
                return marker.to_broker
            return next((b for b in ranked_active if b != marker.from_broker), None)
        if marker.reason == "rebalance":
            if marker.to_broker is not None and marker.to_broker in active:
                return marker.to_broker
            return next((b for b in ranked_active if b != marker.from_broker), None)
        if not ranked_active:
            return None
        scores = dict(rankings)
        threshold = round_robin_threshold(min(scores[b] for b in ranked_active))
        candidates = [b for b in ranked_active if scores[b] <= threshold]
        # Rotate in id order: rankings change after every pick, ids do not.
        later = [b for b in sorted(candidates) if self.last is not None and b > self.last]
        pick = later[0] if later else min(candidates)
        self.last = pick
        return pick
