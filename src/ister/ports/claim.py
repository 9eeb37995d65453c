"""The fence on one loaded topic, and a replicated topic's leader as the broker sees it."""

from __future__ import annotations

from typing import Protocol


class ReplicationGate(Protocol):
    """A replicated topic's leader (docs/replication.md): publishes are acknowledged once enough replicas
    hold them."""

    def check_writable(self) -> None:
        """Raise Unavailable when nothing could be committed now (too few in-sync replicas, fenced)."""

    def appended(self) -> None:
        """Records became durable on this broker."""

    async def wait_committed(self, end: int) -> None:
        """Return once every offset below `end` is committed (Unavailable when it cannot be here)."""

    async def hand_over(self, within: float) -> None:
        """Appends are refused already: return once every in-sync replica holds the whole log, so any of
        them can lead next without the durable tier (Unavailable when that does not happen in time)."""

    async def close(self, reason: str) -> None: ...


class TopicClaim(Protocol):
    """The fence on one loaded topic: consulted before every append and every owner-only metadata write."""

    @property
    def epoch(self) -> int: ...

    @property
    def replication(self) -> ReplicationGate | None:
        """The topic's replication leader, None for a topic with one copy."""

    def check(self, count: int = 1) -> None:
        """Raise Fenced unless this broker may append `count` records now."""

    def appended(self) -> None:
        """Records were appended (a claim with offset reservations may extend its reservation)."""

    def revoke(self, reason: str) -> None:
        """Nothing lands through this claim any more (idempotent)."""

    async def guarded_put(self, key: str, value: object) -> None:
        """A metadata write that lands only while this broker owns the topic (else Fenced)."""
