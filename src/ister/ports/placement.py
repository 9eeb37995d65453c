"""Who may serve a topic, as the broker's data path asks it: the one port both modes implement.

The broker never asks which mode it runs in. It asks its `Placement` whether a topic is served here, where
it is served otherwise, to claim a topic it loads (the claim fences every append and every owner-only
metadata write) and to move a topic away. Standalone (broker/standalone.py) serves everything here; the
cluster's implementation is cluster/placement.py. The admin API's questions are a port of their own
(placement_admin.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ister.ids import TopicName
    from ister.ports.claim import TopicClaim
    from ister.ports.host import TopicHost
    from ister.storage.topic_log import LogStart, OpenedLog
    from ister.storage.wal import Wal


@dataclass(frozen=True, slots=True)
class LogPlan:
    """Where a reliable topic's log continues, as the placement read it from the metadata."""

    start: LogStart | None  # None: the placement opens the log itself (a replicated leader's own copy)
    context: object = None  # the placement's own: what its claim compares against


class Placement(Protocol):
    @property
    def broker_id(self) -> int: ...

    @property
    def moves_need_export(self) -> bool:
        """A seal must first put the topic's records where the next owner reads them (True in a cluster;
        standalone reloads the same WAL)."""

    @property
    def loads_new_topics_here(self) -> bool:
        """An admin creation loads the topics here at once (else the placement decides later)."""

    # -- lifecycle ----------------------------------------------------------------------------------------
    def bind(self, host: TopicHost) -> None:
        """The broker service this placement serves (called once, by the service's constructor)."""

    async def start(self) -> None:
        """Begin (cluster: join, after the servers are up, since the watcher may load topics at once)."""

    async def close(self) -> None:
        """End (cluster: leave last, once cursors were flushed as the owner)."""

    # -- serving ------------------------------------------------------------------------------------------
    def serves(self, topic: str) -> bool:
        """The topic is assigned to this broker (it may load it now)."""

    async def ensure_served_here(self, name: TopicName) -> None:
        """Wait briefly for an owner; raise Unavailable (redo the lookup) unless it is this broker."""

    async def locate(self, name: TopicName) -> str | None:
        """URL of the broker serving an existing topic, None when it is this one (Unavailable meanwhile)."""

    def not_served_error(self, what: str) -> Exception:
        """The error for a call about something this broker does not serve (NotFound or Unavailable)."""

    async def topics_created(self, names: list[TopicName]) -> None:
        """New topics' metadata was written: place them (cluster: queue them for the leader)."""

    def check_room_for_new(self, count: int, what: str) -> None:
        """Raise ResourceExhausted before anything is written when new topics would load here over the
        broker's topic limit (only when they are loaded here at once)."""

    # -- claiming -----------------------------------------------------------------------------------------
    async def plan_log(self, name: TopicName) -> LogPlan:
        """Read where a reliable topic's offsets continue (the owner opens its log there)."""

    async def claim_log(
        self, name: TopicName, plan: LogPlan, opened: OpenedLog | None
    ) -> tuple[Wal, TopicClaim]:
        """Claim a reliable topic whose log the owner opened as `plan` said (`opened` is None when the
        plan's start was None: the placement opens it here). A failed claim leaves closing an opened log to
        the owner."""

    async def claim_volatile(self, name: TopicName) -> TopicClaim:
        """Claim a non-reliable topic (no WAL)."""

    async def request_unload(self, name: TopicName) -> None:
        """Admin unload: move the topic away (standalone: seal it here; it reloads on next use)."""

    async def topic_deleted(self, name: TopicName) -> None:
        """Its metadata is going: let go of it (cluster: delete its assignment so the owner fences it)."""
