"""One topic's owner on this broker: it holds the topic's lifecycle (core/lifecycle.py), takes the events
of a load, a move, a fence and a close, and carries out the effects the table names through the ports.

Standalone and cluster differ only in the `Placement` (and the claims it hands out) plugged in: the owner
asks it where the log continues, opens the log there itself (storage's `open_topic_log`), and asks it to
claim the topic. What a failed effect means is the owner's to report as the next event: a failed load is
LOAD_FAILED, a failed export before a move is SEAL_FAILED (the topic keeps being served here), a failure
after the release ends the seal with CLOSE (it reloads where it was).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

from ister.core.lifecycle import LOAD_EFFECTS, Effect, Event, State, TopicLifecycle
from ister.errors import FailedPrecondition, Unavailable
from ister.ids import TopicName
from ister.metadata import keys
from ister.storage.topic_log import OpenedLog, open_topic_log
from ister.storage.topic_storage import SEAL_EXPORT_SECONDS, TopicStorage

if TYPE_CHECKING:
    from ister.ports.claim import TopicClaim
    from ister.ports.placement import LogPlan, Placement
    from ister.storage.objects import SegmentExporter
    from ister.storage.wal import Wal

log = logging.getLogger(__name__)


class Served(Protocol):
    """What the owner needs of the topic it serves (broker/topic.py's `Topic`)."""

    @property
    def name(self) -> TopicName: ...

    @property
    def wal(self) -> Wal | None: ...

    @property
    def claim(self) -> TopicClaim: ...

    @property
    def exporter(self) -> SegmentExporter | None: ...

    async def release(self) -> None:
        """Flush cursors, end streams, close the log (appends are refused already)."""


S = TypeVar("S", bound=Served)
S_contra = TypeVar("S_contra", bound=Served, contravariant=True)


class OwnerHost(Protocol[S_contra]):
    """Where served topics are listed (broker/topics.py's `TopicRegistry`)."""

    def register(self, topic: S_contra) -> None: ...

    def drop(self, name: str) -> None: ...

    def forget_clients(self, topic: S_contra) -> None: ...


class TopicOwner(Generic[S]):
    """Runs one load of one topic through the lifecycle table, from LOADING to CLOSED."""

    def __init__(self, name: TopicName, placement: Placement, storage: TopicStorage, host: OwnerHost[S]):
        self.name = name
        self.placement = placement
        self.storage = storage
        self.host = host
        self.lifecycle = TopicLifecycle()
        self.topic: S | None = None
        self._reliable = False
        self._plan: LogPlan | None = None
        self._opened: OpenedLog | None = None
        self._wal: Wal | None = None
        self._claim: TopicClaim | None = None
        self._released = False
        self._revoke_reason = ""

    @property
    def state(self) -> State:
        return self.lifecycle.state

    # -- events ---------------------------------------------------------------------------------------
    async def load(
        self,
        reliable: bool,
        make: Callable[[Wal | None, TopicClaim, TopicLifecycle], S],
        prepare: Callable[[S], Awaitable[None]],
    ) -> S:
        """Open the log and claim the topic, build it (`make`) and read what it needs (`prepare`); served
        once CLAIMED. Any failure is LOAD_FAILED: the claim is given back and the log closed."""
        self._reliable = reliable
        try:
            await self._run(LOAD_EFFECTS)
            assert self._claim is not None
            topic = self.topic = make(self._wal, self._claim, self.lifecycle)
            await prepare(topic)
        except BaseException:
            self._revoke_reason = "load failed"
            await self._event(Event.LOAD_FAILED)
            raise
        await self._event(Event.CLAIMED)
        return topic

    async def seal(self, reason: str) -> None:
        """A move or an admin unload: refuse appends, put every acknowledged record where the next owner
        reads it, release, write the sealed state; then the topic is forgotten here."""
        effects = self.lifecycle.handle(Event.SEAL, reason).effects  # producers get UNAVAILABLE from here
        self._revoke_reason = f"sealed ({reason})"
        exported = effects.index(Effect.EXPORT_TAIL) + 1
        try:
            await self._run(effects[:exported])
        except BaseException:
            await self._event(Event.SEAL_FAILED)  # serving resumes here
            raise
        try:
            await self._run(effects[exported:])
            if self.lifecycle.state is State.SEALING:  # not fenced or closed meanwhile (a lease lost)
                await self._event(Event.SEALED)
        finally:
            await self._event(Event.CLOSE)

    async def fence(self, reason: str) -> None:
        """Ownership is gone (reassigned, lease lost, deleted): the topic is forgotten here and released."""
        await self._event(Event.FENCE, reason)

    async def close(self) -> None:
        """Unload or shutdown."""
        await self._event(Event.CLOSE)

    async def _event(self, event: Event, reason: str = "") -> None:
        await self._run(self.lifecycle.handle(event, reason).effects)

    # -- effects --------------------------------------------------------------------------------------
    async def _run(self, effects: tuple[Effect, ...]) -> None:
        for effect in effects:
            await self._handlers[effect](self)

    async def _open_log(self) -> None:
        if self._reliable:
            self._plan = plan = await self.placement.plan_log(self.name)
            if plan.start is not None:
                self._opened = await open_topic_log(self.storage, self.name, plan.start)
                self._wal = self._opened.wal

    async def _write_claim(self) -> None:
        if self._plan is not None:
            self._wal, self._claim = await self.placement.claim_log(self.name, self._plan, self._opened)
        else:
            self._claim = await self.placement.claim_volatile(self.name)

    async def _register(self) -> None:
        self.host.register(self._served())

    async def _forget_clients(self) -> None:
        if self.topic is not None:
            self.host.forget_clients(self.topic)

    async def _release(self) -> None:
        if self._released:
            return
        self._released = True
        if self.topic is not None:
            await self.topic.release()
        elif self._wal is not None:  # the claim or building the topic failed
            await self._wal.close()

    async def _drop(self) -> None:
        self.host.drop(self.name.full)

    async def _revoke_claim(self) -> None:
        if self._claim is not None:
            self._claim.revoke(self._revoke_reason or self.lifecycle.reason)

    def _served(self) -> S:
        assert self.topic is not None, "effects after the load need the topic"
        return self.topic

    async def _export_tail(self) -> None:
        topic = self._served()
        wal = topic.wal
        gate = topic.claim.replication
        if wal is None or (gate is None and not self.placement.moves_need_export):
            return  # standalone reloads the same WAL; a non-reliable topic has no records to move
        if gate is not None:
            # Replicated: a leadership transfer. The next owner is an in-sync replica; it needs every
            # record on its own copy, not in the durable tier.
            await gate.hand_over(SEAL_EXPORT_SECONDS)
            return
        broker = self.placement.broker_id
        exporter = topic.exporter
        if exporter is None:
            if wal.committed_offset > wal.first_offset:
                raise FailedPrecondition(
                    f"cannot move {self.name}: this cluster has no durable tier (storage.durable), so its "
                    f"offsets {wal.first_offset}..{wal.committed_offset - 1} exist only on broker {broker}; "
                    "configure a shared durable tier to move reliable topics. It stays on this broker"
                )
            return
        try:
            await self.storage.export_tail_now(wal, exporter)
        except Exception as exc:
            cause = "timed out" if isinstance(exc, TimeoutError) else str(exc) or repr(exc)
            log.warning("%s: cannot move it, exporting its tail failed: %s", self.name, cause)
            raise Unavailable(
                f"cannot move {self.name}: exporting its last records to the durable tier failed "
                f"({cause}); it stays on broker {broker}"
            ) from exc

    async def _finish_export(self) -> None:
        topic = self._served()
        exporter = topic.exporter
        if exporter is None:
            return
        try:
            async with asyncio.timeout(SEAL_EXPORT_SECONDS):
                await exporter.export_tail()
        except Exception as exc:
            if self.placement.moves_need_export and topic.claim.replication is None:
                # Everything was exported just before; the topic reloads here from its WAL.
                raise Unavailable(
                    f"cannot move {self.name}: exporting its last records failed ({exc}); "
                    "it is reloaded where it was"
                ) from exc
            # Standalone reloads the same WAL: the export only has to happen some time.
            log.warning("%s: exporting the tail at seal failed: %s", self.name, exc)

    async def _write_sealed(self) -> None:
        topic = self._served()
        wal = topic.wal
        if wal is None or wal.committed_offset <= 0:
            return
        state = {
            "sealed": True,
            "last_committed_offset": wal.committed_offset - 1,
            "broker_id": self.placement.broker_id,
            "timestamp": int(time.time()),
            "epoch": topic.claim.epoch,
        }
        await topic.claim.guarded_put(keys.storage_state(self.name.full), state)
        log.info("sealed %s at offset %d (%s)", self.name, wal.committed_offset - 1, self.lifecycle.reason)

    _handlers: ClassVar[dict[Effect, Callable[[TopicOwner[Any]], Awaitable[None]]]] = {
        Effect.OPEN_LOG: _open_log,
        Effect.WRITE_CLAIM: _write_claim,
        Effect.REGISTER: _register,
        Effect.EXPORT_TAIL: _export_tail,
        Effect.FORGET_CLIENTS: _forget_clients,
        Effect.RELEASE: _release,
        Effect.FINISH_EXPORT: _finish_export,
        Effect.WRITE_SEALED: _write_sealed,
        Effect.DROP: _drop,
        Effect.REVOKE_CLAIM: _revoke_claim,
    }
