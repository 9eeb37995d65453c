"""The pure cluster logic: broker choice (Fair, round-robin among near-equal brokers, markers), the leader's
failover/assignment planning, and ownership epochs with offset reservations; at the end, the guard that
applies the reservation math (`ister.cluster.guard`) with a fake store and WAL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ister.cluster.guard import OwnershipGuard
from ister.cluster.membership import LeaseClock
from ister.core.cluster.assignment import BrokerSelector, Marker, fair_rankings, round_robin_threshold
from ister.core.cluster.ownership import (
    DEFAULT_RESERVATION,
    OwnerRecord,
    assign,
    extend,
    needs_extension,
    plan_load,
)
from ister.core.cluster.planner import (
    ACTIVE,
    DRAINED,
    DRAINING,
    Assign,
    ClusterState,
    Orphan,
    orphans,
    plan_assignments,
)
from ister.errors import Fenced, MetadataError
from ister.metadata import keys
from ister.metadata.store import Compare, KeyValue, Put

broker_ids = st.integers(min_value=0, max_value=40)
counts_maps = st.dictionaries(broker_ids, st.integers(min_value=0, max_value=300), max_size=8)
REASONS = [None, "failover", "unload", "rebalance", "drain_redirect"]


def pick_many(selector: BrokerSelector, counts: dict[int, int], active: set[int], n: int) -> list[int]:
    """`n` plain picks, counting each one as the planner does."""
    picks = []
    for _ in range(n):
        broker = selector.choose(fair_rankings(counts), active)
        assert broker is not None
        counts[broker] += 1
        picks.append(broker)
    return picks


# -- fair_rankings ---------------------------------------------------------------------------------------
def test_rankings_by_count_then_id() -> None:
    assert fair_rankings({5: 2, 3: 2, 9: 0, 1: 7, 4: 2}) == [(9, 0), (3, 2), (4, 2), (5, 2), (1, 7)]
    assert fair_rankings({}) == []


@given(counts_maps, st.randoms(use_true_random=False))
def test_rankings_do_not_depend_on_insertion_order(counts: dict[int, int], rnd: Any) -> None:
    items = list(counts.items())
    rnd.shuffle(items)
    ranked = fair_rankings(dict(items))
    assert ranked == fair_rankings(counts)
    assert sorted(ranked) == sorted(counts.items())
    assert [(s, b) for b, s in ranked] == sorted((s, b) for b, s in counts.items())


# -- round_robin_threshold ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("lowest", "threshold"),
    [
        (0, 0),
        (1, 1),
        (5, 5),
        (9, 9),
        (10, 11),
        (15, 16),
        (19, 20),
        (20, 22),
        (99, 108),
        (100, 110),
        (1000, 1100),
    ],
)
def test_threshold_table(lowest: int, threshold: int) -> None:
    assert round_robin_threshold(lowest) == threshold


@given(st.integers(min_value=0, max_value=10**9))
def test_threshold_exact_below_ten_else_ten_percent_at_least_one(lowest: int) -> None:
    t = round_robin_threshold(lowest)
    if lowest < 10:
        assert t == lowest
    else:
        assert lowest + 1 <= t <= lowest + lowest / 10
    assert round_robin_threshold(lowest + 1) >= t  # monotone


# -- BrokerSelector.choose: Fair with round-robin ---------------------------------------------------------
def test_first_pick_among_equal_brokers_is_the_lowest_id() -> None:
    assert BrokerSelector().choose(fair_rankings({7: 0, 3: 0, 11: 0}), {3, 7, 11}) == 3


def test_nine_new_topics_spread_three_three_three_rotating_in_id_order() -> None:
    counts = {7: 0, 3: 0, 11: 0}
    picks = pick_many(BrokerSelector(), counts, {3, 7, 11}, 9)
    assert picks == [3, 7, 11] * 3
    assert counts == {3: 3, 7: 3, 11: 3}


def test_rotation_follows_ids_not_rankings() -> None:
    selector = BrokerSelector()
    rankings = fair_rankings({1: 5, 2: 5, 3: 5})
    selector.last = 2
    assert selector.choose(rankings, {1, 2, 3}) == 3
    assert selector.choose(rankings, {1, 2, 3}) == 1  # wraps to the lowest id
    assert selector.last == 1
    selector.last = 99  # a broker that is gone: wrap around
    assert selector.choose(rankings, {1, 2, 3}) == 1


def test_only_brokers_within_threshold_take_turns() -> None:
    selector = BrokerSelector()
    # exact below 10: the single lowest broker gets everything until it catches up
    assert pick_many(selector, {1: 0, 2: 2, 3: 3}, {1, 2, 3}, 2) == [1, 1]
    # 20 -> threshold 22: brokers 1 and 2 alternate, 3 (23) waits
    selector = BrokerSelector()
    selector.last = 1
    rankings = fair_rankings({1: 20, 2: 22, 3: 23})
    assert selector.choose(rankings, {1, 2, 3}) == 2
    assert selector.choose(rankings, {1, 2, 3}) == 1


def test_a_burst_over_unequal_brokers_fills_the_light_one_first() -> None:
    counts = {1: 6, 2: 0, 3: 6}
    picks = pick_many(BrokerSelector(), counts, {1, 2, 3}, 9)
    assert picks[:6] == [2] * 6
    assert counts == {1: 7, 2: 7, 3: 7}


def test_inactive_brokers_are_never_chosen() -> None:
    counts = {1: 50, 2: 0, 3: 0}  # 2 and 3 are lighter but draining / drained
    selector = BrokerSelector()
    for marker in [
        None,
        Marker(),
        Marker("failover", from_broker=9),
        Marker("drain_redirect", from_broker=2),
    ]:
        assert selector.choose(fair_rankings(counts), {1}, marker) == 1
    assert selector.choose(fair_rankings(counts), {1}, Marker("rebalance", from_broker=2, to_broker=3)) == 1
    assert selector.choose(fair_rankings(counts), {1}, Marker("unload", from_broker=2)) == 1


def test_no_active_broker_means_wait() -> None:
    selector = BrokerSelector()
    selector.last = 4
    rankings = fair_rankings({1: 0, 2: 0})
    assert selector.choose(rankings, set()) is None
    assert selector.choose(rankings, {5}) is None  # active but not ranked (not live)
    assert selector.choose([], {1}) is None
    assert selector.last == 4  # a refusal does not move the rotation


def test_unload_marker_waits_until_ready_then_avoids_the_old_owner() -> None:
    selector = BrokerSelector()
    rankings = fair_rankings({1: 0, 2: 3, 3: 5})
    assert selector.choose(rankings, {1, 2, 3}, Marker("unload", from_broker=2, ready=False)) is None
    assert selector.choose(rankings, {1, 2, 3}, Marker("unload", from_broker=1, ready=True)) == 2
    assert selector.choose(rankings, {1, 2, 3}, Marker("unload", from_broker=3)) == 1
    # Danube moves an unloaded topic to a *different* broker: with none, it waits.
    assert selector.choose(rankings, {2}, Marker("unload", from_broker=2)) is None
    assert selector.choose(rankings, {2, 3}, Marker("unload", from_broker=None)) == 2


def test_rebalance_marker_honours_an_active_target_else_falls_back() -> None:
    selector = BrokerSelector()
    rankings = fair_rankings({1: 0, 2: 3, 3: 9})
    marker = Marker("rebalance", from_broker=1, to_broker=3)
    assert selector.choose(rankings, {1, 2, 3}, marker) == 3  # even though 3 is the heaviest
    assert selector.choose(rankings, {1, 2}, marker) == 2  # 3 not active: best other than the source
    assert selector.choose(rankings, {1, 2}, Marker("rebalance", from_broker=1, to_broker=77)) == 2
    assert selector.choose(rankings, {1, 2}, Marker("rebalance", from_broker=2)) == 1
    assert selector.choose(rankings, {1}, Marker("rebalance", from_broker=1)) is None


def test_failover_marker_is_a_plain_fair_choice() -> None:
    rankings = fair_rankings({1: 4, 2: 0})
    assert BrokerSelector().choose(rankings, {1, 2}, Marker("failover", from_broker=2)) == 2


markers = st.builds(
    Marker,
    reason=st.sampled_from(REASONS),
    from_broker=st.none() | broker_ids,
    to_broker=st.none() | broker_ids,
    ready=st.booleans(),
)


@given(counts_maps, st.sets(broker_ids), st.none() | markers, st.none() | broker_ids)
def test_choice_is_always_a_ranked_active_broker(
    counts: dict[int, int], active: set[int], marker: Marker | None, last: int | None
) -> None:
    active &= set(counts)  # the planner's active brokers are live, so ranked
    selector = BrokerSelector()
    selector.last = last
    choice = selector.choose(fair_rankings(counts), active, marker)
    eligible = set(counts) & active
    if choice is None:
        m = marker or Marker()
        waits = (m.reason == "unload" and not m.ready) or (
            m.reason in ("unload", "rebalance") and eligible <= {m.from_broker}
        )
        assert waits or not eligible
        assert selector.last == last
        return
    assert choice in eligible
    m = marker or Marker()
    if m.reason == "unload":
        assert choice != m.from_broker
    elif m.reason == "rebalance":
        assert choice == m.to_broker if m.to_broker in active else choice != m.from_broker
    else:
        lowest = min(counts[b] for b in eligible)
        assert counts[choice] <= round_robin_threshold(lowest)
        assert selector.last == choice


# -- Marker --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [None, 0, 3, "failover", ["reason", "unload"], True, 1.5, b"x"])
def test_marker_parse_non_dict_is_a_plain_marker(value: object) -> None:
    assert Marker.parse(value) == Marker()


def test_marker_parse_fields() -> None:
    assert Marker.parse({}) == Marker()
    assert Marker.parse({"reason": "unload", "from_broker": 3, "ready": False}) == Marker(
        "unload", 3, None, False
    )
    assert Marker.parse({"reason": "rebalance", "from_broker": 1, "to_broker": 2, "extra": [1]}) == Marker(
        "rebalance", 1, 2, True
    )
    assert Marker.parse({"reason": "failover", "from_broker": 2**63}) == Marker("failover", 2**63)


@pytest.mark.parametrize("bad", [-1, True, False, 1.0, "3", None, [3], {"id": 3}])
def test_marker_parse_drops_bad_broker_ids(bad: object) -> None:
    marker = Marker.parse({"reason": "rebalance", "from_broker": bad, "to_broker": bad})
    assert marker == Marker("rebalance", None, None, True)


@pytest.mark.parametrize("bad", [0, 1, "false", None, "yes", [], 0.0])
def test_marker_parse_non_bool_ready_is_ready(bad: object) -> None:
    assert Marker.parse({"reason": "unload", "ready": bad}).ready is True


@pytest.mark.parametrize("bad", [3, None, True, ["unload"], {"x": 1}])
def test_marker_parse_non_string_reason_is_a_new_topic(bad: object) -> None:
    assert Marker.parse({"reason": bad, "from_broker": 1}).reason is None


def test_marker_to_json() -> None:
    assert Marker().to_json() is None  # the plain 'assign me' marker is stored as null
    assert Marker("failover", from_broker=4).to_json() == {"reason": "failover", "from_broker": 4}
    assert Marker("unload", from_broker=4, ready=False).to_json() == {
        "reason": "unload",
        "from_broker": 4,
        "ready": False,
    }
    assert Marker("unload").to_json() == {"reason": "unload", "ready": True}
    assert Marker("rebalance", 1, 2).to_json() == {"reason": "rebalance", "from_broker": 1, "to_broker": 2}


canonical_markers = st.one_of(
    st.just(Marker()),
    st.builds(
        Marker,
        reason=st.sampled_from(["failover", "rebalance", "drain_redirect", "anything"]),
        from_broker=st.none() | st.integers(min_value=0, max_value=2**64),
        to_broker=st.none() | st.integers(min_value=0, max_value=2**64),
    ),
    st.builds(
        Marker,
        reason=st.just("unload"),
        from_broker=st.none() | broker_ids,
        to_broker=st.none() | broker_ids,
        ready=st.booleans(),
    ),
)


@given(canonical_markers)
def test_marker_round_trips_through_json(marker: Marker) -> None:
    stored = json.loads(json.dumps(marker.to_json()))
    assert Marker.parse(stored) == marker


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats() | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=12,
)
marker_dicts = st.fixed_dictionaries(
    {},
    optional={
        "reason": json_values | st.sampled_from(REASONS),
        "from_broker": json_values | broker_ids,
        "to_broker": json_values | broker_ids,
        "ready": json_values,
    },
)


@given(json_values | marker_dicts)
def test_marker_parse_is_total_and_its_json_form_is_a_fixed_point(value: Any) -> None:
    marker = Marker.parse(value)
    assert marker.reason is None or isinstance(marker.reason, str)
    for b in (marker.from_broker, marker.to_broker):
        assert b is None or (type(b) is int and b >= 0)
    assert type(marker.ready) is bool
    once = marker.to_json()
    assert Marker.parse(once).to_json() == once


# -- ClusterState, orphans -------------------------------------------------------------------------------
def test_state_active_and_counts() -> None:
    state = ClusterState(
        live={1, 2, 3, 4},
        assignments={"a": 1, "b": 1, "c": 3, "d": 9},
        unassigned={},
        modes={2: DRAINING, 3: DRAINED, 4: ACTIVE, 9: ACTIVE},
    )
    assert state.active() == {1, 4}  # a missing mode is active
    assert state.topic_counts() == {1: 2, 2: 0, 3: 1, 4: 0}  # dead broker 9 is not counted


def test_orphans_are_exactly_assignments_to_brokers_that_are_not_live() -> None:
    state = ClusterState(
        live={1, 2},
        assignments={"t-d": 4, "t-a": 1, "t-b": 3, "t-c": 2, "t-e": 2},
        unassigned={"t-z": Marker()},
        modes={2: DRAINED},  # a drained but live broker keeps its topics
    )
    assert orphans(state) == [Orphan("t-b", 3), Orphan("t-d", 4)]
    assert orphans(ClusterState(live=set(), assignments={}, unassigned={})) == []


assignment_maps = st.dictionaries(st.text(min_size=1, max_size=3), broker_ids, max_size=30)


@given(st.sets(broker_ids), assignment_maps)
def test_orphans_property(live: set[int], assignments: dict[str, int]) -> None:
    found = orphans(ClusterState(live=live, assignments=assignments, unassigned={}))
    assert [o.topic for o in found] == sorted(o.topic for o in found)
    assert {(o.topic, o.dead_broker) for o in found} == {
        (t, b) for t, b in assignments.items() if b not in live
    }


# -- plan_assignments --------------------------------------------------------------------------------------
def test_plan_skips_topics_still_owned_by_a_live_broker() -> None:
    state = ClusterState(
        live={1, 2},
        assignments={"moving": 1, "draining-owner": 2, "dead-owner": 7},
        unassigned={"moving": Marker(), "draining-owner": Marker(), "dead-owner": Marker(), "new": Marker()},
        modes={2: DRAINING},
    )
    plan = plan_assignments(state, BrokerSelector())
    assert [(a.topic, a.broker) for a in plan] == [("dead-owner", 1), ("new", 1)]


def test_plan_goes_in_name_order_and_carries_the_marker() -> None:
    failover = Marker("failover", from_broker=9)
    state = ClusterState(
        live={1, 2}, assignments={}, unassigned={"b": failover, "a": Marker(), "c": Marker()}
    )
    assert plan_assignments(state, BrokerSelector()) == [
        Assign("a", 1, Marker()),
        Assign("b", 2, failover),
        Assign("c", 1, Marker()),
    ]


def test_plan_counts_its_own_picks_1000_topics_over_3_brokers() -> None:
    unassigned = {f"topic-{i:04d}": Marker() for i in range(1000)}
    state = ClusterState(live={10, 20, 30}, assignments={}, unassigned=unassigned)
    plan = plan_assignments(state, BrokerSelector())
    assert len(plan) == 1000
    assert {a.topic for a in plan} == set(unassigned)
    counts = Counter(a.broker for a in plan)
    assert set(counts) == {10, 20, 30}
    assert max(counts.values()) - min(counts.values()) <= 1


def test_plan_counts_existing_assignments() -> None:
    state = ClusterState(
        live={1, 2},
        assignments={f"old-{i}": 1 for i in range(5)},
        unassigned={f"new-{i}": Marker() for i in range(7)},
    )
    counts = Counter(a.broker for a in plan_assignments(state, BrokerSelector()))
    assert counts == {2: 6, 1: 1}  # 2 catches up to 5 alone (exact below 10), then they alternate


def test_plan_respects_limit() -> None:
    state = ClusterState(live={1, 2}, assignments={}, unassigned={t: Marker() for t in "edcba"})
    assert plan_assignments(state, BrokerSelector(), limit=0) == []
    assert [a.topic for a in plan_assignments(state, BrokerSelector(), limit=3)] == ["a", "b", "c"]
    assert len(plan_assignments(state, BrokerSelector(), limit=99)) == 5


def test_plan_limit_counts_planned_topics_not_skipped_ones() -> None:
    state = ClusterState(
        live={1, 2},
        assignments={"a": 1},
        unassigned={
            "a": Marker(),
            "b": Marker("unload", from_broker=1, ready=False),
            "c": Marker(),
            "d": Marker(),
        },
    )
    assert [a.topic for a in plan_assignments(state, BrokerSelector(), limit=2)] == ["c", "d"]


def test_plan_only_uses_active_brokers_and_waits_without_one() -> None:
    unassigned = {f"t{i}": Marker() for i in range(6)}
    state = ClusterState(
        live={1, 2, 3}, assignments={}, unassigned=unassigned, modes={1: DRAINING, 3: DRAINED}
    )
    assert {a.broker for a in plan_assignments(state, BrokerSelector())} == {2}
    state = ClusterState(live={1, 3}, assignments={}, unassigned=unassigned, modes={1: DRAINING, 3: DRAINED})
    assert plan_assignments(state, BrokerSelector()) == []
    assert (
        plan_assignments(ClusterState(live=set(), assignments={}, unassigned=unassigned), BrokerSelector())
        == []
    )


def test_plan_round_robin_continues_across_rounds() -> None:
    selector = BrokerSelector()
    live = {1, 2, 3}
    first = plan_assignments(ClusterState(live=live, assignments={}, unassigned={"a": Marker()}), selector)
    assignments = {a.topic: a.broker for a in first}
    second = plan_assignments(
        ClusterState(live=live, assignments=assignments, unassigned={"b": Marker()}), selector
    )
    assert [a.broker for a in first + second] == [1, 2]


@st.composite
def cluster_states(draw: st.DrawFn) -> ClusterState:
    live = draw(st.sets(broker_ids, max_size=6))
    known = sorted(live | draw(st.sets(broker_ids, max_size=3)))
    topics = draw(st.lists(st.text(alphabet="abcdefgh", min_size=1, max_size=3), unique=True, max_size=40))
    assignments = {t: draw(st.sampled_from(known)) for t in topics if known and draw(st.booleans())}
    unassigned = {t: draw(st.one_of(st.just(Marker()), markers)) for t in topics if draw(st.booleans())}
    modes = {b: draw(st.sampled_from([ACTIVE, DRAINING, DRAINED])) for b in known if draw(st.booleans())}
    return ClusterState(live=live, assignments=assignments, unassigned=unassigned, modes=modes)


@settings(max_examples=300)
@given(cluster_states(), st.none() | st.integers(min_value=0, max_value=10), st.none() | broker_ids)
def test_plan_property(state: ClusterState, limit: int | None, last: int | None) -> None:
    selector = BrokerSelector()
    selector.last = last
    plan = plan_assignments(state, selector, limit)
    active = state.active()
    topics = [a.topic for a in plan]
    assert topics == sorted(set(topics))
    assert limit is None or len(plan) <= limit
    for step in plan:
        assert step.broker in active
        assert state.assignments.get(step.topic) not in state.live
        assert step.marker == state.unassigned[step.topic]
    # Plain picks stay within the round-robin threshold of the lightest active broker.
    counts = {b: c for b, c in state.topic_counts().items() if b in active}
    for step in plan:
        if step.marker.reason not in ("unload", "rebalance"):
            assert counts[step.broker] <= round_robin_threshold(min(counts.values()))
        counts[step.broker] += 1
    if limit is None:
        # Every topic left out has a live owner or is waiting for a reason the marker gives.
        for topic, marker in state.unassigned.items():
            if topic not in topics and state.assignments.get(topic) not in state.live:
                assert not active or marker.reason in ("unload", "rebalance")


@given(st.lists(st.integers(min_value=0, max_value=60), min_size=1, max_size=5), st.integers(0, 400))
def test_plan_spread_never_grows_beyond_the_threshold(initial: list[int], new: int) -> None:
    live = set(range(len(initial)))
    assignments = {f"old-{b}-{i}": b for b, c in enumerate(initial) for i in range(c)}
    unassigned = {f"new-{i:03d}": Marker() for i in range(new)}
    plan = plan_assignments(
        ClusterState(live=live, assignments=assignments, unassigned=unassigned), BrokerSelector()
    )
    final = Counter(dict(enumerate(initial)))
    final.update(a.broker for a in plan)
    lowest = min(final[b] for b in live)
    assert max(final[b] for b in live) <= max(max(initial), round_robin_threshold(lowest) + 1)
    if len(set(initial)) == 1:  # from equal counts the rotation keeps them within one of each other
        assert max(final[b] for b in live) - lowest <= 1


# -- OwnerRecord ---------------------------------------------------------------------------------------------
def test_owner_record_parse_and_json() -> None:
    record = OwnerRecord.parse({"broker_id": 3, "epoch": 2})
    assert record == OwnerRecord(broker_id=3, epoch=2, loaded_epoch=0, reserved_until=0)
    full = {"broker_id": 3, "epoch": 5, "loaded_epoch": 4, "reserved_until": 1000}
    parsed = OwnerRecord.parse(full)
    assert parsed is not None
    assert parsed.to_json() == full
    assert OwnerRecord.parse({**full, "unknown": "ignored"}) == parsed


@pytest.mark.parametrize(
    "bad",
    [
        None,
        3,
        "x",
        [3, 1],
        {},
        {"epoch": 1},
        {"broker_id": 1},
        {"broker_id": -1, "epoch": 1},
        {"broker_id": 1, "epoch": -1},
        {"broker_id": 1, "epoch": 1, "loaded_epoch": -1},
        {"broker_id": 1, "epoch": 1, "reserved_until": -5},
        {"broker_id": True, "epoch": 1},
        {"broker_id": 1, "epoch": 1.0},
        {"broker_id": "1", "epoch": 1},
        {"broker_id": None, "epoch": 1},
        {"broker_id": 1, "epoch": 1, "reserved_until": None},
        {1: 2},
    ],
)
def test_owner_record_parse_rejects_bad_shapes(bad: object) -> None:
    assert OwnerRecord.parse(bad) is None


owner_records = st.builds(
    OwnerRecord,
    broker_id=st.integers(min_value=0, max_value=2**63),
    epoch=st.integers(min_value=0, max_value=10**6),
    loaded_epoch=st.integers(min_value=0, max_value=10**6),
    reserved_until=st.integers(min_value=0, max_value=10**12),
)


@given(owner_records)
def test_owner_record_round_trips(record: OwnerRecord) -> None:
    assert OwnerRecord.parse(json.loads(json.dumps(record.to_json()))) == record


# -- assign --------------------------------------------------------------------------------------------------
def test_assign_a_new_topic() -> None:
    assert assign(None, 7) == OwnerRecord(broker_id=7, epoch=1, loaded_epoch=0, reserved_until=0)


@given(owner_records, broker_ids)
def test_assign_bumps_the_epoch_and_keeps_the_rest(previous: OwnerRecord, broker: int) -> None:
    record = assign(previous, broker)
    assert record.broker_id == broker
    assert record.epoch == previous.epoch + 1
    assert record.loaded_epoch == previous.loaded_epoch
    assert record.reserved_until == previous.reserved_until


# -- plan_load -----------------------------------------------------------------------------------------------
def test_load_a_new_topic_starts_at_zero() -> None:
    plan = plan_load(assign(None, 1), None, None)
    assert (plan.keep_local, plan.start_offset) == (False, 0)
    assert plan.record == OwnerRecord(
        broker_id=1, epoch=1, loaded_epoch=1, reserved_until=DEFAULT_RESERVATION
    )


def test_load_a_new_topic_over_a_leftover_wal_starts_fresh() -> None:
    plan = plan_load(assign(None, 1), 5, 40, reservation=10)
    assert (plan.keep_local, plan.start_offset, plan.record.reserved_until) == (False, 0, 10)


def test_load_same_lineage_keeps_the_local_wal() -> None:
    record = OwnerRecord(broker_id=2, epoch=3, loaded_epoch=2, reserved_until=100)
    plan = plan_load(record, 2, 37, reservation=50)
    assert (plan.keep_local, plan.start_offset) == (True, 37)
    assert plan.record == OwnerRecord(broker_id=2, epoch=3, loaded_epoch=3, reserved_until=100)
    plan = plan_load(record, 2, 80, reservation=50)
    assert (plan.keep_local, plan.start_offset, plan.record.reserved_until) == (True, 80, 130)


def test_load_superseded_local_wal_starts_at_the_reservation_end() -> None:
    record = OwnerRecord(broker_id=2, epoch=5, loaded_epoch=4, reserved_until=100)
    for local_epoch, local_next in [(3, 60), (1, 99), (None, None), (4, None), (None, 12)]:
        plan = plan_load(record, local_epoch, local_next, reservation=50)
        assert (plan.keep_local, plan.start_offset) == (False, 100), (local_epoch, local_next)
        assert plan.record == OwnerRecord(broker_id=2, epoch=5, loaded_epoch=5, reserved_until=150)


def test_load_after_a_seal_continues_densely() -> None:
    record = OwnerRecord(broker_id=2, epoch=5, loaded_epoch=4, reserved_until=100)
    # The sealing owner (the last loader) wrote exactly up to the seal: no gap up to the reservation end.
    assert plan_load(record, None, None, sealed_next=150, reservation=10).start_offset == 150
    assert plan_load(record, None, None, sealed_next=30, reservation=10).start_offset == 30
    assert plan_load(record, None, None, sealed_next=0, reservation=10).start_offset == 0
    kept = plan_load(record, 4, 37, sealed_next=60, reservation=10)
    assert (kept.keep_local, kept.start_offset, kept.record.reserved_until) == (True, 60, 100)
    kept = plan_load(record, 4, 37, sealed_next=20, reservation=10)
    assert (kept.keep_local, kept.start_offset) == (True, 37)


@given(
    owner_records,
    st.none() | st.integers(min_value=0, max_value=10**6),
    st.none() | st.integers(min_value=0, max_value=10**12),
    st.none() | st.integers(min_value=0, max_value=10**12),
    st.integers(min_value=1, max_value=10**8),
)
def test_plan_load_property(
    record: OwnerRecord, local_epoch: int | None, local_next: int | None, sealed: int | None, reservation: int
) -> None:
    plan = plan_load(record, local_epoch, local_next, sealed, reservation)
    keep = local_epoch is not None and local_next is not None and local_epoch == record.loaded_epoch
    assert plan.keep_local == keep
    if keep:
        assert local_next is not None
        assert plan.start_offset >= local_next
    elif sealed is not None:
        # A trusted seal (the caller checks its epoch): the sealing owner stopped right there.
        assert plan.start_offset == sealed
    else:
        # A WAL of another lineage is never continued: nothing below the reservation end is reused.
        assert plan.start_offset >= record.reserved_until
    if keep or sealed is None:
        assert plan.start_offset >= (sealed or 0)
    assert plan.start_offset in (record.reserved_until, local_next, sealed)
    new = plan.record
    assert (new.broker_id, new.epoch, new.loaded_epoch) == (record.broker_id, record.epoch, record.epoch)
    assert new.reserved_until == max(plan.start_offset + reservation, record.reserved_until)


# -- needs_extension / extend ----------------------------------------------------------------------------
def test_extension_math() -> None:
    record = OwnerRecord(broker_id=1, epoch=2, loaded_epoch=2, reserved_until=150)
    assert not needs_extension(record, 100, 100)  # 50 left: exactly half
    assert needs_extension(record, 101, 100)
    assert needs_extension(record, 150, 100)
    assert extend(record, 101, 100) == OwnerRecord(broker_id=1, epoch=2, loaded_epoch=2, reserved_until=201)
    assert extend(record, 20, 100).reserved_until == 150  # never shrinks
    assert not needs_extension(OwnerRecord(broker_id=1, epoch=1, reserved_until=DEFAULT_RESERVATION), 0)
    assert needs_extension(OwnerRecord(broker_id=1, epoch=1, reserved_until=DEFAULT_RESERVATION), 50_001)


@given(owner_records, st.integers(min_value=0, max_value=10**12), st.integers(min_value=1, max_value=10**8))
def test_extend_property(record: OwnerRecord, next_offset: int, reservation: int) -> None:
    new = extend(record, next_offset, reservation)
    assert new.reserved_until >= max(record.reserved_until, next_offset + reservation)
    assert (new.broker_id, new.epoch, new.loaded_epoch) == (
        record.broker_id,
        record.epoch,
        record.loaded_epoch,
    )
    assert not needs_extension(new, next_offset, reservation)
    assert needs_extension(record, next_offset, reservation) == (
        record.reserved_until - next_offset < reservation // 2
    )


@given(
    st.integers(min_value=2, max_value=200),
    st.integers(min_value=0, max_value=1000),
    st.lists(st.integers(min_value=1, max_value=100), max_size=60),
)
def test_an_owner_that_extends_at_once_never_hits_the_reservation_end(
    reservation: int, start: int, batches: list[int]
) -> None:
    """With every extension succeeding right away, batches up to half a reservation always fit."""
    plan = plan_load(
        OwnerRecord(broker_id=1, epoch=1, reserved_until=start), None, None, reservation=reservation
    )
    record, next_offset = plan.record, plan.start_offset
    for wanted in batches:
        batch = min(wanted, reservation // 2)
        assert next_offset + batch <= record.reserved_until
        next_offset += batch
        if needs_extension(record, next_offset, reservation):
            record = extend(record, next_offset, reservation)
        assert next_offset < record.reserved_until


# -- the guard that applies needs_extension/extend (ister.cluster.guard), with fakes around it --------------
TOPIC = "/default/guarded"


class OneKeyStore:
    """What OwnershipGuard uses of the metadata store, for its one owner key; unreachable while `down`."""

    def __init__(self, key: str, record: OwnerRecord) -> None:
        self.key = key
        self.value: Any = record.to_json()
        self.version = 1
        self.down = False

    async def txn(self, compares: list[Compare], ops: list[Put]) -> bool:
        if self.down:
            raise MetadataError("etcd unreachable")
        if any(c.key == self.key and c.version != self.version for c in compares):
            return False
        for op in ops:
            self.value, self.version = op.value, self.version + 1
        return True

    async def get(self, key: str) -> KeyValue | None:
        return KeyValue(key, self.value, self.version) if key == self.key else None


class WalLimit:
    """What the guard uses of a WAL: its next offset and `limit_offsets`."""

    def __init__(self) -> None:
        self.next_offset = 0
        self.offset_limit: int | None = None

    def limit_offsets(self, end: int | None) -> None:
        self.offset_limit = end


async def publish(guard: OwnershipGuard, wal: WalLimit, count: int) -> None:
    """What `Topic.publish_batch` does around a WAL append in cluster mode (Wal._check_limit included)."""
    guard.check(count)
    if wal.offset_limit is not None and wal.next_offset + count > wal.offset_limit:
        raise Fenced("outside this owner's reservation")
    wal.next_offset += count
    guard.appended()


async def let_tasks_run() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


def owner_guard(reservation: int) -> tuple[OwnershipGuard, OneKeyStore, WalLimit]:
    record = OwnerRecord(broker_id=1, epoch=1, loaded_epoch=1, reserved_until=reservation)
    store = OneKeyStore(keys.owner(TOPIC), record)
    clock = LeaseClock()
    clock.valid_until = time.monotonic() + 3600  # the lease never lapses in these tests
    guard = OwnershipGuard(TOPIC, store, clock, record, 1, reservation)  # type: ignore[arg-type]
    wal = WalLimit()
    guard.bind(wal)  # type: ignore[arg-type]
    return guard, store, wal


async def test_guard_extends_at_half_and_a_stale_owner_cannot() -> None:
    guard, store, wal = owner_guard(1000)
    await publish(guard, wal, 500)
    await let_tasks_run()
    assert wal.offset_limit == 1000  # exactly half left: no extension yet
    await publish(guard, wal, 1)
    await let_tasks_run()
    assert wal.offset_limit == 1501 and store.version == 2
    store.value = assign(OwnerRecord.parse(store.value), 2).to_json()  # the leader moves the topic
    store.version += 1
    await publish(guard, wal, 501)  # 499 left: it tries to extend, the compare-and-set fails
    await let_tasks_run()
    assert guard.revoked is not None and wal.offset_limit == wal.next_offset == 1002
    with pytest.raises(Fenced):
        await publish(guard, wal, 1)


async def test_guard_retries_a_failed_extension_once_the_store_is_back() -> None:
    guard, store, wal = owner_guard(1000)
    store.down = True  # etcd briefly unreachable (shorter than the lease TTL)
    await publish(guard, wal, 600)  # 400 left: an extension starts and fails
    await let_tasks_run()
    await publish(guard, wal, 400)  # reservation used up; the new attempt fails too
    await let_tasks_run()
    store.down = False
    for _ in range(5):  # the producer keeps retrying
        with contextlib.suppress(Fenced):
            await publish(guard, wal, 1)
        await let_tasks_run()
    assert wal.next_offset > 1000


def test_plan_assignments_with_strategy_scores_prefers_the_lightest_then_spreads() -> None:
    state = ClusterState(
        live={1, 2, 3},
        assignments={},
        unassigned={f"/default/s{i}": Marker() for i in range(6)},
    )
    # Broker 3 is far heavier (e.g. Balanced: CPU-bound); 1 and 2 are equal.
    plan = plan_assignments(state, BrokerSelector(), scores={1: 10.0, 2: 10.0, 3: 40.0}, step=1.0)
    picks = Counter(a.broker for a in plan)
    assert picks[3] == 0 and picks[1] == picks[2] == 3
