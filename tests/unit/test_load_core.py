"""The pure load manager: load reports and their lenient parsing, rates from counters, the three ranking
strategies (seed 002 formulas, on hand-made reports), imbalance metrics (the seed's worked example), the
rebalancing settings and the one-move-per-check planner with each of its rules.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ister.core.cluster.assignment import BrokerSelector, Marker
from ister.core.cluster.load import (
    CPU,
    DISK_IO,
    FOLLOWER_WEIGHT,
    MEMORY,
    NETWORK_IO,
    STRATEGIES,
    LoadReport,
    Rates,
    RateTracker,
    TopicLoad,
    follower_load,
    imbalance,
    imbalance_of,
    place_topic,
    rank,
    rank_balanced,
    rank_fair,
    rank_replica_candidates,
    rank_weighted_load,
    replica_placement_load,
    spread_over_zones,
    topic_load_score,
    weighted_load_metrics,
    weighted_load_score,
    weighted_topic_load,
)
from ister.core.cluster.rebalance import (
    LEVELS,
    Move,
    RebalanceConfig,
    RebalancePlanner,
    blacklisted,
    moves_in_last_hour,
)
from ister.errors import ConfigError


def topics(prefix: str, n: int, mbps: float = 0.0) -> list[TopicLoad]:
    return [TopicLoad.build(f"/{prefix}/t{i:03d}", byte_rate=mbps * 1e6) for i in range(n)]


def counts_reports(counts: dict[int, int]) -> dict[int, LoadReport]:
    """Brokers hosting `n` identical idle topics each, named /b{id}/t000...: Fair scores are the counts."""
    return {b: LoadReport.build(b, 0, topics(f"b{b}", n)) for b, n in counts.items()}


def seen(reports: dict[int, LoadReport], at: float = 0.0) -> dict[str, float]:
    return {t.topic_name: at for r in reports.values() for t in r.topics}


# -- load report -------------------------------------------------------------------------------------------
DANUBE_REPORT: dict[str, Any] = {
    "resources_usage": [
        {"resource": "CPU", "usage": 12.5},
        {"resource": "Memory", "usage": 40.0},
        {"resource": "NetworkIO", "usage": 123456.0},
    ],
    "topics": [
        {
            "topic_name": "/default/orders",
            "message_rate": 120,
            "byte_rate": 2500000,
            "byte_rate_mbps": 2.5,
            "producer_count": 2,
            "consumer_count": 3,
            "subscription_count": 1,
            "backlog_messages": 0,
        }
    ],
    "total_throughput_mbps": 2.5,
    "total_message_rate": 120,
    "total_lag_messages": 0,
    "timestamp": 1700000000,
    "broker_id": 7,
}


def test_report_parses_danube_json_and_round_trips() -> None:
    report = LoadReport.parse(DANUBE_REPORT)
    assert report is not None
    assert (report.broker_id, report.cpu, report.memory, report.usage(NETWORK_IO)) == (
        7,
        12.5,
        40.0,
        123456.0,
    )
    assert report.usage(DISK_IO) == 0.0  # not reported
    assert report.topic_count == 1
    orders = report.topic("/default/orders")
    assert orders is not None and orders.connections == 5 and orders.byte_rate_mbps == 2.5
    assert report.to_json() == DANUBE_REPORT
    import msgspec

    assert LoadReport.parse(msgspec.json.encode(DANUBE_REPORT)) == report
    assert LoadReport.parse(msgspec.json.encode(DANUBE_REPORT).decode()) == report


def test_report_defaults_and_unknown_fields() -> None:
    report = LoadReport.parse({"broker_id": 3, "future_field": [1, 2], "topics": [{"topic_name": "/a/b"}]})
    assert report is not None
    assert report.resources_usage == [] and report.cpu == 0.0 and report.total_message_rate == 0
    assert report.topics == [TopicLoad(topic_name="/a/b")]
    # Unknown resource kinds are kept (and ignored by the rankings).
    odd = LoadReport.parse({"broker_id": 1, "resources_usage": [{"resource": "GPU", "usage": 99}]})
    assert odd is not None and odd.usage("GPU") == 99 and odd.cpu == 0.0


@pytest.mark.parametrize(
    "value",
    [
        None,
        42,
        "not json",
        b"{",
        b"[]",
        [],
        {},  # broker_id is required
        {"broker_id": -1},
        {"broker_id": True},
        {"broker_id": "7"},
        {"broker_id": 1, "topics": None},
        {"broker_id": 1, "topics": [{"message_rate": 1}]},  # no topic_name
        {"broker_id": 1, "topics": [{"topic_name": "/a/b", "message_rate": -3}]},
        {"broker_id": 1, "topics": [{"topic_name": "/a/b", "message_rate": 1.5}]},
        {"broker_id": 1, "topics": [{"topic_name": "/a/b", "byte_rate_mbps": float("inf")}]},
        {"broker_id": 1, "resources_usage": [{"resource": "CPU", "usage": float("nan")}]},
        {"broker_id": 1, "resources_usage": [{"resource": "CPU"}]},
        {"broker_id": 1, "total_throughput_mbps": "fast"},
        {"broker_id": 1, "timestamp": -5},
    ],
)
def test_report_parse_bad_input_is_none(value: Any) -> None:
    assert LoadReport.parse(value) is None


@given(
    st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(), st.lists, max_leaves=8)
)
def test_report_parse_never_raises(value: Any) -> None:
    LoadReport.parse(value)
    LoadReport.parse({"broker_id": 1, "topics": value})
    LoadReport.parse({"broker_id": 1, "resources_usage": value})


def test_report_follower_fields_round_trip() -> None:
    """The Ister extension: a broker's follower copies, totals only (docs/metadata.md)."""
    report = LoadReport.build(
        4, 10, topics("n", 1), followed_topics=3, follower_rates=Rates(250.4, 2_500_000.0)
    )
    assert (report.followed_topics, report.follower_message_rate, report.follower_byte_rate) == (
        3,
        250,
        2_500_000,
    )
    assert report.follower_throughput_mbps == 2.5
    assert report.total_message_rate == 0  # the led topics' totals are unchanged by the copies
    wire = report.to_json()
    assert wire["followed_topics"] == 3 and wire["follower_throughput_mbps"] == 2.5
    import msgspec

    assert LoadReport.parse(msgspec.json.encode(wire)) == report
    # Without copies the report is Danube's shape: the extension's fields are left out.
    assert "followed_topics" not in LoadReport.build(4, 10, topics("n", 1)).to_json()


def test_report_without_follower_fields_parses_as_zero() -> None:
    """Danube's reports and Ister's before the extension: no follower fields, no follower load."""
    report = LoadReport.parse(DANUBE_REPORT)
    assert report is not None
    assert (report.followed_topics, report.follower_message_rate, report.follower_byte_rate) == (0, 0, 0)
    assert report.follower_throughput_mbps == 0.0 and follower_load(report) == 0.0
    # Lenient as the rest: unknown neighbours ignored; a bad follower value rejects the report.
    assert LoadReport.parse({**DANUBE_REPORT, "followed_topics": 2, "x": 1}) is not None
    for bad in (
        {"followed_topics": -1},
        {"follower_message_rate": 1.5},
        {"follower_byte_rate": "many"},
        {"follower_throughput_mbps": float("inf")},
    ):
        assert LoadReport.parse({**DANUBE_REPORT, **bad}) is None, bad


def test_report_build_computes_totals() -> None:
    a = TopicLoad.build("/n/a", message_rate=10.4, byte_rate=1_500_000, producer_count=1, backlog_messages=5)
    b = TopicLoad.build("/n/b", message_rate=2.6, byte_rate=500_000, consumer_count=2)
    assert (a.message_rate, a.byte_rate, a.byte_rate_mbps) == (10, 1_500_000, 1.5)
    report = LoadReport.build(4, 99.9, [a, b], cpu=150, memory=-3, disk_io=10)
    assert report.timestamp == 99
    assert (report.cpu, report.memory, report.usage(DISK_IO)) == (100.0, 0.0, 10.0)
    assert [r.resource for r in report.resources_usage] == [CPU, MEMORY, DISK_IO]
    assert report.total_throughput_mbps == 2.0
    assert report.total_message_rate == 13
    assert report.total_lag_messages == 5
    assert LoadReport.parse(report.to_json()) == report
    assert LoadReport.empty(9, 5).to_json()["topics"] == []


def test_place_topic_carries_the_topics_load() -> None:
    hot = TopicLoad.build("/n/hot", byte_rate=4e6)
    reports = {1: LoadReport.build(1, 0, [hot, *topics("n", 1)]), 2: LoadReport.build(2, 0)}
    moved = place_topic(reports, "/n/hot", 2)
    assert [t.topic_name for t in moved[1].topics] == ["/n/t000"]
    assert moved[2].topics == [hot] and moved[2].total_throughput_mbps == 4.0
    assert moved[1].total_throughput_mbps == 0.0
    # A new topic gets a zeroed placeholder; a broker without a report gets one.
    new = place_topic(moved, "/n/new", 3)
    assert new[3].topics == [TopicLoad(topic_name="/n/new")]
    # None: the topic is unassigned everywhere; the input is not modified.
    gone = place_topic(new, "/n/hot", None)
    assert all(r.topic("/n/hot") is None for r in gone.values())
    assert reports[1].topic("/n/hot") == hot


# -- rates -------------------------------------------------------------------------------------------------
def test_rate_tracker() -> None:
    rt = RateTracker()
    assert rt.update("t", 100, 1000, now=10.0) == Rates()  # first sample: no rate yet
    assert rt.update("t", 300, 5000, now=12.0) == Rates(100.0, 2000.0)
    # Too close to the last sample: previous rates, baseline kept.
    assert rt.update("t", 310, 5100, now=12.05) == Rates(100.0, 2000.0)
    assert rt.update("t", 340, 5400, now=13.0) == Rates(40.0, 400.0)
    assert rt.rates("t") == Rates(40.0, 400.0)
    # Counters restarted (topic reloaded): what was counted since counts over the interval.
    assert rt.update("t", 20, 200, now=15.0) == Rates(10.0, 100.0)
    # Clock went back: new baseline, rates kept.
    assert rt.update("t", 30, 300, now=14.0) == Rates(10.0, 100.0)
    assert rt.update("t", 50, 700, now=16.0) == Rates(10.0, 200.0)
    rt.update("u", 0, 0, now=16.0)
    rt.retain({"u"})
    assert rt.rates("t") == Rates() and rt.update("t", 500, 500, now=17.0) == Rates()
    rt.forget("u")
    assert rt.update("u", 9, 9, now=20.0) == Rates()


# -- rankings ----------------------------------------------------------------------------------------------
def test_topic_load_score_seed_formula() -> None:
    t = TopicLoad.build("/n/t", byte_rate=10e6, producer_count=2, consumer_count=1, backlog_messages=20_000)
    # 0.2*1 + 0.3*10 MB/s + 0.3*3 connections + 0.2*20000/10000
    assert topic_load_score(t) == pytest.approx(0.2 + 3.0 + 0.9 + 0.4)
    assert topic_load_score(TopicLoad(topic_name="/n/idle")) == pytest.approx(0.2)
    report = LoadReport.build(1, 0, [t, TopicLoad(topic_name="/n/idle")])
    assert weighted_topic_load(report) == pytest.approx(4.5 + 0.2)
    assert weighted_topic_load(LoadReport.empty(1)) == 0.0


def followers(report: LoadReport, copies: int, mbps: float = 0.0) -> LoadReport:
    """`report` with `copies` follower copies appending `mbps` MB/s together."""
    import msgspec

    return msgspec.structs.replace(
        report,
        followed_topics=copies,
        follower_byte_rate=round(mbps * 1e6),
        follower_throughput_mbps=mbps,
        follower_message_rate=round(mbps * 1000),
    )


def test_follower_load_is_half_a_led_topics_disk_and_network_part() -> None:
    hot = TopicLoad.build("/n/hot", byte_rate=4e6, producer_count=2, consumer_count=3, backlog_messages=1)
    led = LoadReport.build(1, 0, [hot])
    # The same traffic as a follower copy: 0.5 x (0.2 + 0.3 x 4 MB/s); no connections, no backlog.
    copy = followers(LoadReport.build(2, 0), 1, mbps=4.0)
    assert follower_load(copy) == pytest.approx(FOLLOWER_WEIGHT * (0.2 + 1.2))
    assert weighted_topic_load(copy) == pytest.approx(0.7)
    assert weighted_topic_load(led) == pytest.approx(topic_load_score(hot))
    assert weighted_topic_load(followers(led, 1, 4.0)) == pytest.approx(topic_load_score(hot) + 0.7)


def test_every_strategy_counts_follower_copies() -> None:
    """Two brokers leading the same; one also follows 40 busy topics: it ranks as the more loaded one."""
    base = {b: LoadReport.build(b, 0, topics(f"b{b}", 10, mbps=0.5), cpu=30, memory=30) for b in (1, 2)}
    reports = {1: followers(base[1], 40, mbps=60.0), 2: base[2]}
    # Fair: 10 led + 40 copies at half a topic each.
    assert rank_fair(reports) == [(2, 10), (1, 30)]
    # Balanced: 0.3 x (topic load + follower load) + 0.35 x CPU + 0.35 x memory.
    led = weighted_topic_load(base[1])
    assert rank_balanced(reports) == [(2, int(0.3 * led + 21)), (1, int(0.3 * (led + 0.5 * 22) + 21))]
    # WeightedLoad: throughput (5 + 0.5 x 60 MB/s) and topic load are its bottleneck.
    metrics = weighted_load_metrics(reports)
    assert metrics[1][2] == 1.0 and metrics[2][2] == pytest.approx(5 / 35)
    assert metrics[1][3] == 1.0 and metrics[2][3] < 0.5
    assert [b for b, _ in rank_weighted_load(reports)] == [2, 1]
    # Every strategy: the broker busy with copies ranks last.
    assert all(rank(s, reports)[-1][0] == 1 for s in STRATEGIES)


def test_rebalancing_moves_led_topics_off_a_broker_busy_with_copies() -> None:
    """Equal led load, but broker 1 also follows busy topics: the planner sees it overloaded and moves one
    of its led topics; the topic's share excludes the copies (they do not move with it)."""
    base = {b: LoadReport.build(b, 0, topics(f"b{b}", 4, mbps=1.0), cpu=1, memory=1) for b in (1, 2, 3)}
    reports = {**base, 1: followers(base[1], 30, mbps=40.0)}
    planner = RebalancePlanner(RebalanceConfig.preset("aggressive", enabled=True), "balanced")
    without = planner.plan(base, {1, 2, 3}, seen(base), [], 1_000.0)
    assert without.status == "balanced"
    decision = planner.plan(reports, {1, 2, 3}, seen(reports), [], 1_000.0)
    assert decision.status == "move" and decision.move is not None
    assert decision.move.from_broker == 1 and decision.move.to_broker == 2
    loads = dict(decision.rankings)
    share = planner._share(reports[1], loads[1], decision.move.topic)
    topic = reports[1].topic(decision.move.topic)
    assert topic is not None
    assert share == pytest.approx(loads[1] * topic_load_score(topic) / weighted_topic_load(reports[1]))


def test_fair_ranks_by_topic_count_then_id() -> None:
    reports = counts_reports({5: 2, 3: 2, 9: 0, 1: 7})
    assert rank_fair(reports) == [(9, 0), (3, 2), (5, 2), (1, 7)]
    assert rank("fair", reports) == rank_fair(reports)
    assert rank_fair({}) == []


def test_balanced_seed_weights() -> None:
    t = TopicLoad.build("/n/t", byte_rate=10e6, producer_count=2, consumer_count=1, backlog_messages=20_000)
    reports = {
        1: LoadReport.build(1, 0, [t], cpu=40, memory=20),  # 0.3*4.5 + 0.35*40 + 0.35*20 = 22.35
        2: LoadReport.build(2, 0, [], cpu=10, memory=10),  # 7
        3: LoadReport.build(3, 0, [], cpu=10, memory=10.5),  # 7.175, truncated to 7: tie broken by id
    }
    assert rank_balanced(reports) == [(2, 7), (3, 7), (1, 22)]
    assert rank("balanced", reports) == rank_balanced(reports)


def test_balanced_falls_back_to_topic_count_without_resource_usage() -> None:
    reports = counts_reports({1: 3, 2: 1})
    assert rank_balanced(reports) == [(2, 1), (1, 3)]


def test_weighted_load_bottleneck_and_even_weights() -> None:
    reports = {
        # thr 10 MB/s (the max), topic load 3.2 (the max): bottlenecked on throughput and topic load.
        1: LoadReport.build(1, 0, [TopicLoad.build("/n/a", byte_rate=10e6)], cpu=50, memory=30),
        # thr 0.5, topic load 1.7/3.2: nothing above 70 %.
        2: LoadReport.build(2, 0, [TopicLoad.build("/n/b", byte_rate=5e6)], cpu=20, memory=10),
    }
    metrics = weighted_load_metrics(reports)
    assert metrics[1] == pytest.approx((0.5, 0.3, 1.0, 1.0))
    assert metrics[2] == pytest.approx((0.2, 0.1, 0.5, 1.7 / 3.2))
    # Bottleneck 1.0 weighs 50 %, the other three share 50 %: 0.5 + 0.5 * (0.5 + 0.3 + 1.0) / 3 = 0.8.
    assert weighted_load_score(metrics[1]) == pytest.approx(0.8)
    # Even weights: 25 % each.
    assert weighted_load_score(metrics[2]) == pytest.approx((0.2 + 0.1 + 0.5 + 1.7 / 3.2) / 4)
    assert rank_weighted_load(reports) == [(2, 33), (1, 80)]
    assert rank("weighted_load", reports) == rank_weighted_load(reports)


def test_weighted_load_cpu_bottleneck_and_idle_floor() -> None:
    reports = {
        1: LoadReport.build(1, 0, [TopicLoad.build("/n/a", byte_rate=0.5e6)], cpu=90, memory=10),
        2: LoadReport.build(2, 0, [], cpu=10, memory=10),
    }
    metrics = weighted_load_metrics(reports)
    # Throughput and topic load are relative to a max floored at 1: 0.5 MB/s is not "saturated".
    assert metrics[1] == pytest.approx((0.9, 0.1, 0.5, 0.35))
    assert metrics[2] == pytest.approx((0.1, 0.1, 0.0, 0.0))
    assert rank_weighted_load(reports) == [(2, 5), (1, 60)]  # 100 * (0.45 + 0.5 * 0.95 / 3) = 60.8


@given(st.lists(st.floats(0, 1), min_size=4, max_size=4), st.integers(0, 3), st.floats(0, 1))
def test_weighted_load_score_never_drops_when_a_metric_rises(m: list[float], i: int, up: float) -> None:
    higher = list(m)
    higher[i] = max(m[i], up)
    assert weighted_load_score(higher) >= weighted_load_score(m) - 1e-12


def test_unknown_strategy() -> None:
    with pytest.raises(ValueError, match="unknown assignment strategy"):
        rank("random", {})  # type: ignore[arg-type]


@pytest.mark.parametrize("strategy", ["fair", "balanced", "weighted_load"])
def test_rankings_feed_the_broker_selector(strategy: Any) -> None:
    reports = {
        1: LoadReport.build(1, 0, topics("a", 30, mbps=2), cpu=80, memory=70),
        2: LoadReport.build(2, 0, topics("b", 2, mbps=0.1), cpu=5, memory=10),
        3: LoadReport.build(3, 0, topics("c", 12, mbps=1), cpu=40, memory=30),
    }
    rankings = rank(strategy, reports)
    assert rankings[0][0] == 2
    assert BrokerSelector().choose(rankings, {1, 2, 3}) == 2
    assert BrokerSelector().choose(rankings, {1, 3}) == 3


@given(st.dictionaries(st.integers(0, 50), st.integers(0, 40), max_size=8), st.randoms(use_true_random=False))
def test_rankings_are_sorted_and_order_independent(counts: dict[int, int], rnd: Any) -> None:
    reports = {
        b: LoadReport.build(b, 0, topics(f"b{b}", n, mbps=n / 7), cpu=n * 2.5, memory=(b * 7) % 100)
        for b, n in counts.items()
    }
    items = list(reports.items())
    rnd.shuffle(items)
    for strategy in ("fair", "balanced", "weighted_load"):
        ranked = rank(strategy, reports)  # type: ignore[arg-type]
        assert ranked == rank(strategy, dict(items))  # type: ignore[arg-type]
        assert [(s, b) for b, s in ranked] == sorted((s, b) for b, s in ranked)
        assert {b for b, _ in ranked} == set(reports) and all(s >= 0 for _, s in ranked)


# -- follower placement ------------------------------------------------------------------------------------
def test_followers_go_to_the_least_loaded_broker_not_the_fewest_copies() -> None:
    """Broker 2 holds fewer copies but leads busy topics and its copies are busy; 3 holds more idle ones."""
    reports = {
        2: followers(LoadReport.build(2, 0, topics("b2", 3, mbps=20.0)), 2, mbps=30.0),
        3: followers(LoadReport.build(3, 0, topics("b3", 1)), 6),
        4: followers(LoadReport.build(4, 0, topics("b4", 2)), 6),
    }
    copies = {2: 2, 3: 6, 4: 6}
    assert rank_replica_candidates([2, 3, 4], [], reports, copies) == [3, 4, 2]
    # A broker that already holds a copy comes first, whatever its load.
    assert rank_replica_candidates([2, 3, 4], [2], reports, copies) == [2, 3, 4]
    # The copy counts are the records' (current): a burst of new copies on 3 pushes it back.
    assert rank_replica_candidates([3, 4], [], reports, {3: 30, 4: 6}) == [4, 3]
    # Without reports (a new broker, or none written yet): fewest copies, then id, as before.
    assert rank_replica_candidates([7, 5, 6], [], {}, {5: 3, 6: 1}) == [7, 6, 5]
    assert replica_placement_load(None, 4) == pytest.approx(FOLLOWER_WEIGHT * 0.2 * 4)


def test_followers_spread_over_zones_before_load() -> None:
    """The least loaded broker is skipped when its zone already holds a copy (the leader's)."""
    reports = {b: followers(LoadReport.build(b, 0), n) for b, n in {2: 0, 3: 5, 4: 9}.items()}
    ranked = rank_replica_candidates([2, 3, 4], [], reports, {3: 5, 4: 9})
    assert ranked == [2, 3, 4]
    zones = {1: "a", 2: "a", 3: "a", 4: "b"}
    assert spread_over_zones(ranked, zones, {zones[1]}, 2) == [4, 2]
    assert spread_over_zones(ranked, {}, {""}, 2) == [2, 3]


@given(
    st.dictionaries(st.integers(1, 20), st.tuples(st.integers(0, 30), st.floats(0, 50)), max_size=8),
    st.randoms(use_true_random=False),
)
def test_replica_candidates_are_deterministic(loads: dict[int, tuple[int, float]], rnd: Any) -> None:
    reports = {b: followers(LoadReport.build(b, 0), n, mbps) for b, (n, mbps) in loads.items()}
    copies = {b: n for b, (n, _) in loads.items()}
    ranked = rank_replica_candidates(list(loads), [], reports, copies)
    shuffled = list(loads)
    rnd.shuffle(shuffled)
    assert rank_replica_candidates(shuffled, [], reports, copies) == ranked
    scores = [replica_placement_load(reports[b], copies[b]) for b in ranked]
    assert scores == sorted(scores)


# -- imbalance ---------------------------------------------------------------------------------------------
def test_imbalance_seed_worked_example() -> None:
    imb = imbalance([(3, 25), (2, 30), (1, 45)], active={1, 2, 3})
    assert round(imb.mean, 2) == 33.33
    assert round(imb.std_dev, 2) == 8.50
    assert round(imb.cv_percent, 1) == 25.5 and round(imb.cv, 3) == 0.255
    assert (imb.min_load, imb.max_load) == (25, 45)
    assert imb.overloaded == (1,)  # 45 > 41.83
    assert imb.underloaded == ()  # 25 is not < 25.00 (nor < 16.67)
    assert imb.broker_count == 3


def test_imbalance_underloaded_needs_both_conditions() -> None:
    # Three old brokers with 100 topics, two new empty ones: mean 60, std 48.99.
    imb = imbalance([(1, 100), (2, 100), (3, 100), (4, 0), (5, 0)], {1, 2, 3, 4, 5})
    assert imb.underloaded == (4, 5) and imb.overloaded == ()
    assert round(imb.cv_percent) == 82
    # Below mean - std but not below half the mean: normal.
    imb = imbalance_of({1: 100, 2: 100, 3: 100, 4: 100, 5: 70})
    assert imb.mean == 94 and imb.std_dev == 12 and imb.underloaded == ()


def test_imbalance_only_counts_active_brokers() -> None:
    imb = imbalance([(1, 0), (2, 10), (3, 10), (4, 500)], active={2, 3, 4})
    assert set(imb.loads) == {2, 3, 4} and imb.min_load == 10
    assert imbalance([(1, 5)], active=set()) == imbalance_of({})
    empty = imbalance_of({})
    assert (empty.mean, empty.std_dev, empty.cv, empty.broker_count) == (0, 0, 0, 0)
    one = imbalance_of({1: 9})
    assert (one.mean, one.std_dev, one.cv, one.overloaded, one.underloaded) == (9, 0, 0, (), ())
    zeros = imbalance_of({1: 0, 2: 0})
    assert zeros.cv == 0 and zeros.overloaded == ()


@given(st.dictionaries(st.integers(0, 30), st.integers(0, 1000), min_size=1, max_size=10))
def test_imbalance_classification_matches_definition(loads: dict[int, int]) -> None:
    imb = imbalance_of(loads)
    mean = sum(loads.values()) / len(loads)
    assert imb.mean == pytest.approx(mean)
    assert imb.std_dev == pytest.approx(math.sqrt(sum((x - mean) ** 2 for x in loads.values()) / len(loads)))
    assert set(imb.overloaded) == {b for b, x in loads.items() if x > imb.mean + imb.std_dev}
    assert set(imb.underloaded) == {
        b for b, x in loads.items() if x < imb.mean - imb.std_dev and x < imb.mean / 2
    }
    assert not set(imb.overloaded) & set(imb.underloaded)


# -- rebalancing config ------------------------------------------------------------------------------------
def test_config_defaults_and_levels() -> None:
    cfg = RebalanceConfig()
    assert cfg == RebalanceConfig.from_mapping(None) == RebalanceConfig.from_mapping({})
    assert (cfg.enabled, cfg.aggressiveness, cfg.cv_threshold) == (False, "balanced", 0.30)
    assert (cfg.check_interval_seconds, cfg.max_moves_per_hour, cfg.cooldown_seconds) == (300, 10, 60)
    assert (cfg.min_brokers_for_rebalance, cfg.min_topic_age_seconds, cfg.blacklist_topics) == (2, 300, ())
    expected = {"conservative": (0.40, 600, 5), "balanced": (0.30, 300, 10), "aggressive": (0.20, 120, 20)}
    for level, (threshold, interval, moves) in expected.items():
        c = RebalanceConfig.from_mapping({"aggressiveness": level})
        assert (c.cv_threshold, c.check_interval_seconds, c.max_moves_per_hour) == (
            threshold,
            interval,
            moves,
        )
        assert RebalanceConfig.preset(level) == c  # type: ignore[arg-type]
        assert LEVELS[level].cv_threshold == threshold


def test_config_explicit_keys_override_the_level() -> None:
    cfg = RebalanceConfig.from_mapping(
        {
            "enabled": True,
            "aggressiveness": "aggressive",
            "check_interval_seconds": 30,
            "max_moves_per_hour": 50,
            "cooldown_seconds": 0,
            "min_brokers_for_rebalance": 3,
            "min_topic_age_seconds": 0,
            "blacklist_topics": ["/system/*", "/default/critical-*"],
        }
    )
    assert cfg.enabled and cfg.cv_threshold == 0.20
    assert (cfg.check_interval_seconds, cfg.max_moves_per_hour, cfg.cooldown_seconds) == (30, 50, 0)
    assert cfg.blacklist_topics == ("/system/*", "/default/critical-*")
    assert RebalanceConfig.from_mapping({"blacklist_topics": None}).blacklist_topics == ()


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ({"enabled": "yes"}, r"rebalancing\.enabled must be true or false"),
        ({"aggressiveness": "extreme"}, r"aggressiveness must be one of conservative, balanced, aggressive"),
        ({"aggressiveness": 2}, r"aggressiveness must be one of"),
        ({"check_interval_seconds": 0}, r"check_interval_seconds must be in 1\.\.86400, got 0"),
        ({"check_interval_seconds": 1.5}, r"check_interval_seconds must be an integer"),
        ({"max_moves_per_hour": 0}, r"max_moves_per_hour must be in 1\.\.3600"),
        ({"max_moves_per_hour": True}, r"max_moves_per_hour must be an integer"),
        ({"cooldown_seconds": -1}, r"cooldown_seconds must be in 0\.\.86400"),
        ({"min_brokers_for_rebalance": 1}, r"min_brokers_for_rebalance must be in 2\.\."),
        ({"min_topic_age_seconds": "300"}, r"min_topic_age_seconds must be an integer"),
        ({"blacklist_topics": "/system/*"}, r"blacklist_topics must be a list"),
        ({"blacklist_topics": ["system/*"]}, r"'system/\*' is not a topic pattern"),
        ({"blacklist_topics": ["/system"]}, r"is not a topic pattern; expected /namespace/topic"),
        ({"blacklist_topics": ["/a/b/c"]}, r"is not a topic pattern"),
        ({"blacklist_topics": ["/a//"]}, r"is not a topic pattern"),
        ({"blacklist_topics": [7]}, r"7 is not a topic pattern"),
        ({"check_interval": 300}, r"unknown key\(s\) check_interval; known: "),
    ],
)
def test_config_validation_errors(block: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RebalanceConfig.from_mapping(block)


def test_config_validates_on_construction() -> None:
    with pytest.raises(ConfigError, match="cooldown_seconds"):
        RebalanceConfig(cooldown_seconds=-5)
    with pytest.raises(ConfigError, match="aggressiveness must be one of"):
        RebalanceConfig(aggressiveness=["balanced"])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="must be a mapping"):
        RebalanceConfig.from_mapping(["enabled"])  # type: ignore[arg-type]
    assert RebalanceConfig(blacklist_topics=["/a/b"]).blacklist_topics == ("/a/b",)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("topic", "hit"),
    [
        ("/system/meta", True),
        ("/system/x-part-0", True),
        ("/systems/meta", False),
        ("/default/critical-orders", True),
        ("/default/critical-", True),
        ("/default/critical", False),
        ("/default/orders-critical-1", False),
        ("/other/critical-orders", False),
        ("/analytics/logs", True),
        ("/analytics/logs2", False),
        ("/analytics/log", False),
        ("/x/audit", True),
        ("/x/audit.v2", False),
        ("/a.b/c", True),
        ("/aXb/c", False),  # '.' is literal
    ],
)
def test_blacklist_patterns(topic: str, hit: bool) -> None:
    patterns = ["/system/*", "/default/critical-*", "/analytics/logs", "/*/audit", "/a.b/c"]
    assert blacklisted(topic, patterns) is hit
    assert RebalanceConfig(blacklist_topics=tuple(patterns)).is_blacklisted(topic) is hit


# -- moves -------------------------------------------------------------------------------------------------
def test_move_marker_and_json() -> None:
    move = Move(topic="/n/t", from_broker=1, to_broker=3, estimated_load=5.2, timestamp=1000.5)
    marker = move.marker()
    assert marker == Marker(reason="rebalance", from_broker=1, to_broker=3)
    assert marker.to_json() == {"reason": "rebalance", "from_broker": 1, "to_broker": 3}
    assert Marker.parse(marker.to_json()) == marker
    assert BrokerSelector().choose([(1, 0), (2, 0), (3, 9)], {1, 2, 3}, marker) == 3
    assert BrokerSelector().choose([(1, 0), (2, 0), (3, 9)], {1, 2}, marker) == 2  # target gone: not back
    as_json = move.to_json()
    assert as_json == {
        "topic": "/n/t",
        "from_broker": 1,
        "to_broker": 3,
        "reason": "LoadImbalance",
        "estimated_load": 5.2,
        "timestamp": 1000.5,
    }
    assert Move.parse(as_json) == move
    assert Move.parse(b'{"topic":"/n/t","from_broker":1,"to_broker":2,"timestamp":5}') is not None
    for bad in (None, b"{", {"topic": "/n/t"}, {**as_json, "from_broker": -1}, {**as_json, "timestamp": "x"}):
        assert Move.parse(bad) is None


def test_moves_in_last_hour() -> None:
    history = [
        Move(topic=f"/n/{i}", from_broker=1, to_broker=2, timestamp=t) for i, t in enumerate([0, 100, 3700])
    ]
    assert moves_in_last_hour(history, 3600) == 2  # the one at 0 is exactly an hour old
    assert moves_in_last_hour(history, 3650) == 2
    assert moves_in_last_hour(history, 7300) == 0
    assert moves_in_last_hour(history, 50) == 3  # future entries count


# -- planner -----------------------------------------------------------------------------------------------
NOW = 10_000.0
ON = RebalanceConfig.preset("aggressive", enabled=True, min_topic_age_seconds=300, cooldown_seconds=60)


def planner(cfg: RebalanceConfig = ON, strategy: Any = "fair") -> RebalancePlanner:
    return RebalancePlanner(cfg, strategy)


def test_planner_seed_example_moves_lightest_topic_to_least_loaded() -> None:
    # The worked example as topic counts: CV 25.5 %, broker 1 overloaded.
    reports = counts_reports({1: 45, 2: 30, 3: 25})
    # Give broker 1's topics distinct loads: t007 is the lightest (no traffic); the rest carry some.
    reports[1] = reports[1].with_topics(
        [
            TopicLoad.build(t.topic_name, byte_rate=0 if i == 7 else 1e6 + i)
            for i, t in enumerate(reports[1].topics)
        ]
    )
    decision = planner().plan(reports, {1, 2, 3}, seen(reports), [], NOW)
    assert decision.status == "move"
    assert decision.move == Move(
        topic="/b1/t007", from_broker=1, to_broker=3, estimated_load=0.2, timestamp=NOW
    )
    assert round(decision.imbalance.cv_percent, 1) == 25.5 and decision.imbalance.overloaded == (1,)
    assert decision.rankings == [(3, 25), (2, 30), (1, 45)]
    # Balanced aggressiveness (30 %) leaves the same cluster alone.
    balanced = planner(RebalanceConfig(enabled=True)).plan(reports, {1, 2, 3}, seen(reports), [], NOW)
    assert (balanced.status, balanced.move) == ("balanced", None)
    assert "CV 25.5%" in balanced.detail


def test_planner_disabled_unless_manual() -> None:
    reports = counts_reports({1: 10, 2: 0})
    cfg = RebalanceConfig.preset("aggressive", min_topic_age_seconds=0)
    assert planner(cfg).plan(reports, {1, 2}, seen(reports), [], NOW).status == "disabled"
    manual = planner(cfg).plan(reports, {1, 2}, seen(reports), [], NOW, manual=True)
    assert manual.status == "move" and manual.move is not None and manual.move.to_broker == 2


def test_planner_threshold_is_strict() -> None:
    # Loads 6 and 4: CV exactly 20 %, the aggressive threshold: not above it.
    reports = counts_reports({1: 6, 2: 4})
    assert planner().plan(reports, {1, 2}, seen(reports), [], NOW).status == "balanced"
    reports = counts_reports({1: 7, 2: 4})
    assert planner().plan(reports, {1, 2}, seen(reports), [], NOW).status == "move"


def test_planner_counts_only_active_brokers() -> None:
    reports = counts_reports({1: 20, 2: 0, 3: 0})
    # 2 and 3 are draining/dead: one active broker is too few, whatever the reports say.
    assert planner().plan(reports, {1}, seen(reports), [], NOW).status == "too_few_brokers"
    cfg = RebalanceConfig.preset("aggressive", enabled=True, min_brokers_for_rebalance=3)
    assert planner(cfg).plan(reports, {1, 2}, seen(reports), [], NOW).status == "too_few_brokers"
    # An inactive broker is never the target, even when it is the least loaded.
    decision = planner().plan(
        counts_reports({1: 20, 2: 5, 3: 0}), {1, 2}, seen(counts_reports({1: 20})), [], NOW
    )
    assert decision.move is not None and decision.move.to_broker == 2
    # An active broker without a report yet counts as empty.
    decision = planner().plan(counts_reports({1: 8}), {1, 4}, seen(counts_reports({1: 8})), [], NOW)
    assert decision.move is not None and (decision.move.from_broker, decision.move.to_broker) == (1, 4)


def test_planner_rate_limit() -> None:
    reports = counts_reports({1: 20, 2: 0})
    cfg = RebalanceConfig.preset("aggressive", enabled=True, max_moves_per_hour=3, min_topic_age_seconds=0)
    old = [Move(topic=f"/x/{i}", from_broker=1, to_broker=2, timestamp=NOW - 3600 - i) for i in range(5)]
    recent = [
        Move(topic=f"/y/{i}", from_broker=1, to_broker=2, timestamp=NOW - 1000 * (i + 1)) for i in range(3)
    ]
    decision = planner(cfg).plan(reports, {1, 2}, seen(reports), old + recent, NOW)
    assert decision.status == "rate_limited" and "3 moves in the last hour (max 3)" in decision.detail
    assert planner(cfg).plan(reports, {1, 2}, seen(reports), old + recent[:2], NOW).status == "move"
    # The oldest of the three recent moves leaves the hour at NOW + 600.
    assert planner(cfg).next_allowed(old + recent, NOW) == NOW + 600
    assert planner(cfg).plan(reports, {1, 2}, seen(reports), old + recent, NOW + 600).status == "move"


def test_planner_cooldown_between_moves() -> None:
    reports = counts_reports({1: 20, 2: 0})
    history = [Move(topic="/z/other", from_broker=5, to_broker=6, timestamp=NOW - 59)]
    decision = planner().plan(reports, {1, 2}, seen(reports), history, NOW)
    assert decision.status == "cooldown" and decision.move is None
    assert planner().next_allowed(history, NOW) == NOW + 1
    assert planner().plan(reports, {1, 2}, seen(reports), history, NOW + 1).status == "move"
    assert planner().next_allowed([], NOW) == NOW


def test_planner_min_topic_age() -> None:
    reports = counts_reports({1: 3, 2: 0})
    first_seen = {"/b1/t000": NOW - 299, "/b1/t001": NOW - 300, "/b1/t002": NOW}
    decision = planner().plan(reports, {1, 2}, first_seen, [], NOW)
    assert decision.move is not None and decision.move.topic == "/b1/t001"  # exactly old enough
    # Too young, or never seen (age unknown): nothing to move.
    assert planner().plan(reports, {1, 2}, {"/b1/t000": NOW - 10}, [], NOW).status == "no_candidate"


def test_planner_skips_blacklisted_topics() -> None:
    names = ["/system/a", "/system/b", "/default/critical-x", "/default/z"]
    reports = {1: LoadReport.build(1, 0, [TopicLoad(topic_name=n) for n in names]), 2: LoadReport.empty(2)}
    cfg = RebalanceConfig.preset(
        "aggressive", enabled=True, blacklist_topics=("/system/*", "/default/critical-*")
    )
    decision = planner(cfg).plan(reports, {1, 2}, seen(reports), [], NOW)
    assert decision.move is not None and decision.move.topic == "/default/z"
    cfg = RebalanceConfig.preset("aggressive", enabled=True, blacklist_topics=("/*/*",))
    assert planner(cfg).plan(reports, {1, 2}, seen(reports), [], NOW).status == "no_candidate"


def test_planner_never_moves_a_topic_back_within_the_cooldown() -> None:
    # t000 came from broker 2 90 s ago; now broker 1 is the heavy one. Within the cooldown nothing moves.
    reports = counts_reports({1: 6, 2: 0})
    cfg = RebalanceConfig.preset("aggressive", enabled=True, cooldown_seconds=120, min_topic_age_seconds=0)
    back = Move(topic="/b1/t000", from_broker=2, to_broker=1, timestamp=NOW - 90)
    decision = planner(cfg).plan(reports, {1, 2}, seen(reports), [back], NOW)
    assert (decision.status, decision.move) == ("cooldown", None)
    # A manual trigger is paced too; a dry run ignores pacing but still leaves the moved topic alone.
    manual = planner(cfg).plan(reports, {1, 2}, seen(reports), [back], NOW - 1, manual=True)
    assert manual.status == "cooldown"
    run = planner(cfg).dry_run(reports, {1, 2}, seen(reports), [back], NOW)
    assert run.moves and "/b1/t000" not in {m.topic for m in run.moves}
    # Once the cooldown has passed it may go.
    later = planner(cfg).plan(reports, {1, 2}, seen(reports), [back], NOW + 30)
    assert later.move is not None and later.move.topic == "/b1/t000" and later.move.to_broker == 2


def test_planner_moved_topic_is_young_again() -> None:
    # min_topic_age (300 s) above the cooldown (60 s): a moved topic waits 300 s before it moves again, so
    # another topic goes after the cooldown, and the moved one is not sent back.
    names = [TopicLoad(topic_name="/n/a"), TopicLoad(topic_name="/n/b")]
    reports = {1: LoadReport.build(1, 0, names * 3), 2: LoadReport.empty(2)}
    moved = Move(topic="/n/a", from_broker=2, to_broker=1, timestamp=NOW - 200)
    first_seen = {"/n/a": 0.0, "/n/b": 0.0}
    decision = planner().plan(reports, {1, 2}, first_seen, [moved], NOW)
    assert decision.move is not None and decision.move.topic == "/n/b"
    assert planner().plan(reports, {1, 2}, {"/n/a": 0.0}, [moved], NOW).status == "no_candidate"
    decision = planner().plan(reports, {1, 2}, {"/n/a": 0.0}, [moved], NOW + 100)
    assert decision.move is not None and decision.move.topic == "/n/a"


def test_planner_only_moves_topics_the_source_owns() -> None:
    reports = counts_reports({1: 4, 2: 0})
    owners = {"/b1/t000": 2, "/b1/t001": 1}  # t000 already moved (stale report); t002, t003 unassigned
    decision = planner().plan(reports, {1, 2}, seen(reports), [], NOW, owners=owners)
    assert decision.move is not None and decision.move.topic == "/b1/t001"
    assert planner().plan(reports, {1, 2}, seen(reports), [], NOW, owners={}).status == "no_candidate"


def test_planner_sources_when_none_is_overloaded() -> None:
    # Two brokers are never "overloaded" (load = mean + std exactly); brokers above the mean are sources.
    decision = planner().plan(counts_reports({1: 10, 2: 0}), {1, 2}, seen(counts_reports({1: 10})), [], NOW)
    assert decision.imbalance.overloaded == () and decision.move is not None
    assert (decision.move.from_broker, decision.move.to_broker) == (1, 2)
    # Brokers joined: the new ones are underloaded, nobody is overloaded; the heaviest old one gives first.
    reports = counts_reports({1: 100, 2: 101, 3: 100, 4: 0, 5: 0})
    decision = planner().plan(reports, {1, 2, 3, 4, 5}, seen(reports), [], NOW)
    assert decision.imbalance.underloaded == (4, 5) and decision.imbalance.overloaded == ()
    assert decision.move is not None and (decision.move.from_broker, decision.move.to_broker) == (2, 4)


def test_planner_only_moves_that_narrow_the_gap() -> None:
    # One topic on one of two brokers: CV 100 %, but moving it just swaps the brokers.
    single = counts_reports({1: 1, 2: 0})
    assert planner().plan(single, {1, 2}, seen(single), [], NOW).status == "no_candidate"
    # Balanced: a single hot topic is the whole of broker 1's score; the gap to broker 2 is smaller.
    hot = TopicLoad.build("/n/hot", byte_rate=50e6, producer_count=5)
    reports = {
        1: LoadReport.build(1, 0, [hot], cpu=60, memory=40),
        2: LoadReport.build(2, 0, [], cpu=20, memory=5),
    }
    assert planner(strategy="balanced").plan(reports, {1, 2}, seen(reports), [], NOW).status == "no_candidate"
    # With a lighter topic next to it, the lighter one goes.
    light = TopicLoad.build("/n/light", byte_rate=1e6)
    reports[1] = reports[1].with_topics([hot, light])
    decision = planner(strategy="balanced").plan(reports, {1, 2}, seen(reports), [], NOW)
    assert decision.move is not None and decision.move.topic == "/n/light"
    assert decision.move.estimated_load == pytest.approx(topic_load_score(light))


@pytest.mark.parametrize("strategy", ["fair", "balanced", "weighted_load"])
def test_planner_is_deterministic(strategy: Any) -> None:
    reports = {
        b: LoadReport.build(b, 0, topics(f"b{b}", n, mbps=1), cpu=n * 3, memory=n * 2)
        for b, n in {1: 20, 2: 3, 3: 3, 4: 12}.items()
    }
    a = planner(strategy=strategy).plan(reports, {1, 2, 3, 4}, seen(reports), [], NOW)
    b = planner(strategy=strategy).plan(dict(reversed(reports.items())), [4, 3, 2, 1], seen(reports), [], NOW)
    assert a == b and a.move is not None and a.move.from_broker == 1 and a.move.to_broker == 2


def test_dry_run_lists_moves_until_balanced() -> None:
    reports = counts_reports({1: 30, 2: 30, 3: 0})
    first_seen = seen(reports)
    # Pacing is ignored: a recent move and a full hour do not stop a dry run.
    history = [Move(topic=f"/x/{i}", from_broker=1, to_broker=2, timestamp=NOW - 1) for i in range(20)]
    p = planner(RebalanceConfig.preset("aggressive", enabled=False, max_moves_per_hour=50))
    run = p.dry_run(reports, {1, 2, 3}, first_seen, history, NOW)
    assert len(run.moves) == len({m.topic for m in run.moves})  # each topic once
    assert all(m.to_broker == 3 for m in run.moves)
    assert run.before.cv > 0.2 >= run.after.cv and "balanced" in run.detail
    assert len(run.moves) == 15  # 30/30/0 -> 22/23/15: CV 17.8 % (14 moves: 23/23/14, CV 21.2 %)
    assert run.after.loads == {1: 22, 2: 23, 3: 15}
    assert [(m.topic, m.from_broker) for m in run.moves[:3]] == [
        ("/b1/t000", 1),
        ("/b2/t000", 2),
        ("/b1/t001", 1),
    ]
    # The first move is what plan() does once pacing allows.
    decision = p.plan(reports, {1, 2, 3}, first_seen, [], NOW, manual=True)
    assert decision.move == run.moves[0]
    # A move limit, and the plan is unchanged by it.
    limited = p.dry_run(reports, {1, 2, 3}, first_seen, history, NOW, max_moves=2)
    assert limited.moves == run.moves[:2] and limited.detail == "move limit"
    # Nothing to do on a balanced cluster.
    even = counts_reports({1: 5, 2: 5})
    assert p.dry_run(even, {1, 2}, seen(even), [], NOW).moves == []


def test_dry_run_stops_when_no_candidate_is_left() -> None:
    reports = counts_reports({1: 10, 2: 0})
    first_seen = {name: NOW for name in seen(reports)}  # all too young
    first_seen["/b1/t004"] = 0.0
    run = planner().dry_run(reports, {1, 2}, first_seen, [], NOW)
    assert [m.topic for m in run.moves] == ["/b1/t004"] and run.detail == "no candidate left"
