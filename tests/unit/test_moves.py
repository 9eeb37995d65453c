from ister.core.cluster.moves import (
    BASE_BACKOFF_SECONDS,
    MAX_BACKOFF_SECONDS,
    MAX_CAUSE_CHARS,
    MoveFailure,
    backing_off,
    backoff_seconds,
    next_failure,
)


def test_backoff_doubles_per_failure_in_a_row_and_is_capped() -> None:
    first = next_failure(None, 3, "store down", "unavailable", 1000.0)
    assert first.failures == 1 and first.from_broker == 3
    second = next_failure(first, 3, "store down", "unavailable", 1100.0)
    assert second.failures == 2
    assert backoff_seconds(1) == BASE_BACKOFF_SECONDS
    assert backoff_seconds(2) == 2 * BASE_BACKOFF_SECONDS
    assert backoff_seconds(10_000) == MAX_BACKOFF_SECONDS
    assert backing_off(second, 1100.0 + 2 * BASE_BACKOFF_SECONDS - 1)
    assert not backing_off(second, 1100.0 + 2 * BASE_BACKOFF_SECONDS)


def test_a_failure_on_another_broker_starts_counting_again() -> None:
    note = next_failure(next_failure(None, 1, "x", "unavailable", 0.0), 1, "x", "unavailable", 1.0)
    assert next_failure(note, 2, "y", "failed_precondition", 2.0).failures == 1


def test_note_round_trips_and_bad_values_are_refused() -> None:
    note = next_failure(None, 1, "c" * (MAX_CAUSE_CHARS * 2), "failed_precondition", 5.0)
    assert len(note.cause) == MAX_CAUSE_CHARS
    assert MoveFailure.parse(note.to_json()) == note
    assert MoveFailure.parse({"from_broker": 1, "cause": "x", "at": 1.0, "failures": 0}) is None
    assert MoveFailure.parse({"from_broker": 1, "cause": "x", "at": 1.0, "code": "bogus"}) is None
    assert MoveFailure.parse("nonsense") is None


def test_a_move_whose_old_owner_died_before_sealing_becomes_a_failover() -> None:
    from ister.core.cluster.assignment import Marker
    from ister.core.cluster.planner import ClusterState, abandoned_moves

    state = ClusterState(
        live={1, 2},
        assignments={},
        unassigned={
            "/ns/dead-mover": Marker(reason="unload", from_broker=3, ready=False),
            "/ns/live-mover": Marker(reason="unload", from_broker=1, ready=False),
            "/ns/sealed": Marker(reason="unload", from_broker=3, ready=True),
            "/ns/new": Marker(),
        },
    )
    assert [(o.topic, o.dead_broker) for o in abandoned_moves(state)] == [("/ns/dead-mover", 3)]
