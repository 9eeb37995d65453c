"""The ownership lifecycle table (core/lifecycle.py): its rules, and the copy docs/architecture.md shows."""

from __future__ import annotations

from pathlib import Path

import pytest

from ister.core.lifecycle import (
    EFFECTS,
    LOAD_EFFECTS,
    LOCAL_WAL_TRANSITIONS,
    TRANSITIONS,
    Effect,
    Event,
    LifecycleError,
    LocalWal,
    LocalWalEvent,
    State,
    TopicLifecycle,
    local_wal_after,
    table_markdown,
)


def test_a_move_that_fails_resumes_serving_and_one_that_succeeds_ends_closed() -> None:
    lc = TopicLifecycle()
    assert lc.state is State.LOADING and not lc.accepts_appends and lc.owner_writes
    lc.handle(Event.CLAIMED)
    assert lc.accepts_appends
    lc.handle(Event.SEAL, "unload")
    assert not lc.accepts_appends and lc.owner_writes  # cursors are flushed while sealing
    lc.handle(Event.SEAL_FAILED)
    assert lc.state is State.SERVING and lc.reason == "unload"
    lc.handle(Event.SEAL)
    lc.handle(Event.SEALED)
    assert lc.state is State.HANDED_OFF and not lc.owner_writes
    lc.handle(Event.CLOSE)
    assert [h[2] for h in lc.history] == [
        State.SERVING,
        State.SEALING,
        State.SERVING,
        State.SEALING,
        State.HANDED_OFF,
        State.CLOSED,
    ]


@pytest.mark.parametrize(
    ("path", "refused"),
    [
        ([], Event.SEALED),  # nothing is sealed before it was served
        ([Event.CLAIMED], Event.CLAIMED),  # claimed twice
        ([Event.CLAIMED, Event.FENCE], Event.SEAL),  # a fenced topic cannot be moved
        ([Event.CLAIMED, Event.CLOSE], Event.CLAIMED),  # closed is final
        ([Event.CLAIMED, Event.SEAL, Event.SEALED], Event.SEAL_FAILED),
    ],
)
def test_events_a_state_has_no_row_for_are_refused(path: list[Event], refused: Event) -> None:
    lc = TopicLifecycle()
    for event in path:
        lc.handle(event)
    before = lc.state
    with pytest.raises(LifecycleError):
        lc.handle(refused)
    assert lc.state is before


def test_every_state_is_reachable_and_can_be_closed() -> None:
    reached = {State.LOADING}
    frontier = [State.LOADING]
    while frontier:
        for after in TRANSITIONS[frontier.pop()].values():
            if after not in reached:
                reached.add(after)
                frontier.append(after)
    assert reached == set(State)
    assert all(Event.CLOSE in TRANSITIONS[s] for s in State)


def test_local_wal_is_given_back_only_after_export_or_expiry() -> None:
    assert local_wal_after(LocalWal.CURRENT, LocalWalEvent.OVERTAKEN) is LocalWal.SUPERSEDED
    assert local_wal_after(LocalWal.SUPERSEDED, LocalWalEvent.EXPORTED) is LocalWal.GIVEN_BACK
    with pytest.raises(LifecycleError):
        local_wal_after(LocalWal.CURRENT, LocalWalEvent.EXPORTED)  # a current WAL is not deleted
    assert LOCAL_WAL_TRANSITIONS[LocalWal.GIVEN_BACK] == {}


def test_docs_show_the_table_as_coded() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "architecture.md").read_text()
    assert table_markdown() in doc


def test_each_transition_names_its_effects_in_order() -> None:
    lc = TopicLifecycle()
    assert lc.handle(Event.CLAIMED) == (State.SERVING, (Effect.REGISTER,))
    step = lc.handle(Event.SEAL, "move")
    assert step.state is State.SEALING
    assert step.effects[0] is Effect.EXPORT_TAIL and step.effects[-1] is Effect.WRITE_SEALED
    assert step.effects.index(Effect.RELEASE) < step.effects.index(Effect.WRITE_SEALED)
    assert lc.handle(Event.SEAL_FAILED).effects == ()  # nothing was released: serving resumes
    lc.handle(Event.SEAL)
    assert lc.handle(Event.SEALED).effects == (Effect.DROP, Effect.REVOKE_CLAIM)
    assert lc.handle(Event.CLOSE).effects == ()
    assert LOAD_EFFECTS == (Effect.OPEN_LOG, Effect.WRITE_CLAIM)


def test_effects_exist_only_for_rows_the_table_has() -> None:
    assert all(event in TRANSITIONS[state] for state, event in EFFECTS)
    # Every way out of a live state lets go of the log.
    for state in (State.LOADING, State.SERVING, State.SEALING):
        for event, after in TRANSITIONS[state].items():
            if after in (State.CLOSED, State.FENCED):
                assert Effect.RELEASE in EFFECTS[(state, event)], (state, event)
