"""A topic's ownership lifecycle on one broker: its states, the events that move it, one transition table.

Every place that changes who may write a topic (loading and claiming it, sealing it for a move, losing it
to a newer owner, closing it) goes through `TopicLifecycle.handle`, so the rules live here and nowhere else;
docs/architecture.md renders `TRANSITIONS` and `EFFECTS` (see `table_markdown`). An event a state has no row
for is a bug in the caller and raises `LifecycleError`.

Each transition also names its effects, in order: what the topic's owner (broker/topic_owner.py) must do
through its ports once the state changed. The table is pure; the owner does the I/O and reports how it went
as the next event (an export that fails is SEAL_FAILED, a claim that loses its race is LOAD_FAILED).

The local copy of a topic's records (its WAL directory) has a lifecycle of its own, `LOCAL_WAL_TRANSITIONS`:
a WAL loaded under an older epoch than the owner record's last load is *superseded* (another owner went on
without it); it is archived, exported into the durable tier (only offsets no object holds yet) and deleted
(see storage/superseded.py).
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple


class State(StrEnum):
    LOADING = "loading"  # storage opening and the claim being written; nothing served yet
    SERVING = "serving"  # this broker owns the topic: appends, deliveries, owner-only metadata writes
    SEALING = "sealing"  # a move: appends refused while every acknowledged record is made readable elsewhere
    HANDED_OFF = "handed_off"  # sealed state written; the next owner continues densely after it
    FENCED = "fenced"  # ownership lost (reassigned, lease lost, deleted): nothing this broker writes lands
    CLOSED = "closed"  # forgotten by this broker (unloaded, shut down, load failed)


class Event(StrEnum):
    CLAIMED = "claimed"  # storage open at the planned offset and the claim committed (compare-and-set)
    LOAD_FAILED = "load_failed"  # the claim lost a race or storage could not open: nothing was served
    SEAL = "seal"  # a move or an admin unload asks for the topic
    SEAL_FAILED = "seal_failed"  # the tail could not be exported: the move is refused, serving resumes
    SEALED = "sealed"  # sealed state {last_committed_offset, epoch} written under the claim
    FENCE = "fence"  # the owner record or the assignment changed, or the lease may be gone
    CLOSE = "close"  # unload or shutdown; the object is dropped


class Effect(StrEnum):
    OPEN_LOG = "open_log"  # storage opens the log where the placement says offsets continue
    WRITE_CLAIM = "write_claim"  # the placement commits the claim (compare-and-set in a cluster)
    REGISTER = "register"  # listed as served here: clients find it, exports start
    EXPORT_TAIL = "export_tail"  # every acknowledged record where the next owner reads it (replicas, tier)
    FORGET_CLIENTS = "forget_clients"  # producers and consumers let go before their streams end
    RELEASE = "release"  # cursors flushed, streams ended, the log closed (at most once per load)
    FINISH_EXPORT = "finish_export"  # the segment the close sealed goes to the durable tier
    WRITE_SEALED = "write_sealed"  # {last_committed_offset, epoch} written under the claim
    DROP = "drop"  # no longer listed as served here
    REVOKE_CLAIM = "revoke_claim"  # nothing lands through the claim any more


# A load starts in LOADING with these effects; it ends with CLAIMED, or LOAD_FAILED when one of them fails.
LOAD_EFFECTS = (Effect.OPEN_LOG, Effect.WRITE_CLAIM)

TRANSITIONS: dict[State, dict[Event, State]] = {
    State.LOADING: {
        Event.CLAIMED: State.SERVING,
        Event.LOAD_FAILED: State.CLOSED,
        Event.FENCE: State.FENCED,
        Event.CLOSE: State.CLOSED,
    },
    State.SERVING: {
        Event.SEAL: State.SEALING,
        Event.FENCE: State.FENCED,
        Event.CLOSE: State.CLOSED,
    },
    State.SEALING: {
        Event.SEAL_FAILED: State.SERVING,
        Event.SEALED: State.HANDED_OFF,
        Event.FENCE: State.FENCED,
        Event.CLOSE: State.CLOSED,
    },
    State.HANDED_OFF: {
        Event.FENCE: State.HANDED_OFF,  # the claim is revoked once the hand-off is written: already final
        Event.CLOSE: State.CLOSED,
    },
    State.FENCED: {
        Event.FENCE: State.FENCED,
        Event.SEAL_FAILED: State.FENCED,  # a seal that was under way when the topic was taken away
        Event.CLOSE: State.CLOSED,
    },
    State.CLOSED: {
        Event.FENCE: State.CLOSED,
        Event.SEAL_FAILED: State.CLOSED,
        Event.CLOSE: State.CLOSED,
    },
}

_E = Effect
# What the owner does after each transition, in order. RELEASE runs at most once per load (a fence that
# arrives while a seal releases does not release again). A failure in EXPORT_TAIL is SEAL_FAILED; one in a
# later effect of SEAL ends the seal with CLOSE (the topic reloads where it was).
EFFECTS: dict[tuple[State, Event], tuple[Effect, ...]] = {
    (State.LOADING, Event.CLAIMED): (_E.REGISTER,),
    (State.LOADING, Event.LOAD_FAILED): (_E.REVOKE_CLAIM, _E.RELEASE),
    (State.LOADING, Event.FENCE): (_E.DROP, _E.RELEASE),
    (State.LOADING, Event.CLOSE): (_E.RELEASE,),
    (State.SERVING, Event.SEAL): (
        _E.EXPORT_TAIL,
        _E.FORGET_CLIENTS,
        _E.RELEASE,
        _E.FINISH_EXPORT,
        _E.WRITE_SEALED,
    ),
    (State.SERVING, Event.FENCE): (_E.DROP, _E.RELEASE),
    (State.SERVING, Event.CLOSE): (_E.RELEASE,),
    (State.SEALING, Event.SEAL_FAILED): (),  # nothing was released: appends resume
    (State.SEALING, Event.SEALED): (_E.DROP, _E.REVOKE_CLAIM),
    (State.SEALING, Event.FENCE): (_E.DROP, _E.RELEASE),
    (State.SEALING, Event.CLOSE): (_E.DROP, _E.REVOKE_CLAIM, _E.RELEASE),
    (State.FENCED, Event.CLOSE): (_E.RELEASE,),
}


def effects_of(state: State, event: Event) -> tuple[Effect, ...]:
    """The effects of a transition the table has (none for the rows not listed in `EFFECTS`)."""
    return EFFECTS.get((state, event), ())


# What each state allows. Appends need SERVING; metadata writes only the owner may make (cursor flushes, the
# sealed state) need a live claim, which SEALING still has (cursors are flushed before the hand-off).
ACCEPTS_APPENDS = frozenset({State.SERVING})
OWNER_WRITES = frozenset({State.LOADING, State.SERVING, State.SEALING})


class LifecycleError(RuntimeError):
    """An event the current state has no transition for: a bug in the caller, never a client's fault."""


class Step(NamedTuple):
    state: State  # the state after the event
    effects: tuple[Effect, ...]  # what the owner does now, in order


class TopicLifecycle:
    """The state of one loaded topic; `history` keeps the transitions for logs and tests."""

    __slots__ = ("history", "reason", "state")

    def __init__(self) -> None:
        self.state = State.LOADING
        self.reason = ""  # why the last transition happened (shown in errors clients get)
        self.history: list[tuple[State, Event, State]] = []

    def handle(self, event: Event, reason: str = "") -> Step:
        before = self.state
        after = TRANSITIONS[before].get(event)
        if after is None:
            raise LifecycleError(f"event {event} is not allowed in state {before}")
        self.history.append((before, event, after))
        self.state = after
        if reason:
            self.reason = reason
        return Step(after, effects_of(before, event))

    @property
    def accepts_appends(self) -> bool:
        return self.state in ACCEPTS_APPENDS

    @property
    def owner_writes(self) -> bool:
        return self.state in OWNER_WRITES


class LocalWal(StrEnum):
    CURRENT = "current"  # the WAL the owner record's last load used: the newest copy, continued on reload
    SUPERSEDED = "superseded"  # a newer owner loaded the topic since: archived under wal-stale/, read-only
    GIVEN_BACK = "given_back"  # every record is in the durable tier (or retention ran out): deleted


class LocalWalEvent(StrEnum):
    RELOADED = "reloaded"  # loaded again under the same epoch lineage: continued densely
    OVERTAKEN = "overtaken"  # the owner record names a newer load: archive it
    EXPORTED = "exported"  # every record it holds is covered by durable objects
    EXPIRED = "expired"  # no durable tier: kept for cluster.superseded_wal_retention_seconds, then deleted
    TOPIC_DELETED = "topic_deleted"


LOCAL_WAL_TRANSITIONS: dict[LocalWal, dict[LocalWalEvent, LocalWal]] = {
    LocalWal.CURRENT: {
        LocalWalEvent.RELOADED: LocalWal.CURRENT,
        LocalWalEvent.OVERTAKEN: LocalWal.SUPERSEDED,
        LocalWalEvent.TOPIC_DELETED: LocalWal.GIVEN_BACK,
    },
    LocalWal.SUPERSEDED: {
        LocalWalEvent.EXPORTED: LocalWal.GIVEN_BACK,
        LocalWalEvent.EXPIRED: LocalWal.GIVEN_BACK,
        LocalWalEvent.TOPIC_DELETED: LocalWal.GIVEN_BACK,
    },
    LocalWal.GIVEN_BACK: {},
}


def local_wal_after(state: LocalWal, event: LocalWalEvent) -> LocalWal:
    after = LOCAL_WAL_TRANSITIONS[state].get(event)
    if after is None:
        raise LifecycleError(f"local WAL event {event} is not allowed in state {state}")
    return after


def table_markdown() -> str:
    """Both transition tables as Markdown (docs/architecture.md embeds this output)."""
    load = ", ".join(LOAD_EFFECTS)
    lines = ["| State | Event | Next state | Effects |", "|---|---|---|---|"]
    lines.append(f"| (load) | | loading | {load} |")
    for state, row in TRANSITIONS.items():
        for event, after in row.items():
            effects = ", ".join(effects_of(state, event)) or "-"
            lines.append(f"| {state} | {event} | {after} | {effects} |")
    lines += ["", "| Local WAL | Event | Next |", "|---|---|---|"]
    for wal_state, wal_row in LOCAL_WAL_TRANSITIONS.items():
        for wal_event, wal_after in wal_row.items():
            lines.append(f"| {wal_state} | {wal_event} | {wal_after} |")
    return "\n".join(lines)
