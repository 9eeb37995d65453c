"""The load report a cluster broker writes (cluster/load_report.py): led topics as Danube's report, plus the
follower copies' totals (an Ister extension), parsed back by the load manager."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ister.cluster.load_report import LoadReporter
from ister.core.cluster.load import LoadReport, follower_load


@dataclass
class Stats:
    messages_in: int = 0
    bytes_in: int = 0
    producers: dict[int, Any] = field(default_factory=dict)
    subscriptions: dict[str, Any] = field(default_factory=dict)


def test_follower_copies_are_reported_as_totals_with_rates() -> None:
    reporter = LoadReporter(7)
    led = Stats()
    first = reporter.report([("/n/led", led, 0)], now=100.0, followed=[("/n/a", 0, 0), ("/n/b", 50, 5_000)])
    parsed = LoadReport.parse(first)
    assert parsed is not None and parsed.followed_topics == 2
    assert parsed.follower_message_rate == 0  # the first sample of a copy has no rate yet
    led.messages_in, led.bytes_in = 20, 2_000
    followed = [("/n/a", 100, 1_000_000), ("/n/b", 250, 2_005_000)]
    second = LoadReport.parse(reporter.report([("/n/led", led, 0)], now=110.0, followed=followed))
    assert second is not None
    assert (second.followed_topics, second.follower_message_rate, second.follower_byte_rate) == (
        2,
        30,  # (100 + 200) / 10 s
        300_000,  # (1e6 + 2e6) / 10 s
    )
    assert second.follower_throughput_mbps == 0.3
    assert second.total_message_rate == 2 and second.topic_count == 1  # copies are not led topics
    assert follower_load(second) > 0
    # A copy dropped (its topic replaced elsewhere) leaves the totals; a copy restarted counts from zero.
    third = LoadReport.parse(reporter.report([], now=120.0, followed=[("/n/b", 100, 10_000)]))
    assert third is not None and third.followed_topics == 1
    assert (third.follower_message_rate, third.follower_byte_rate) == (10, 1_000)


def test_a_broker_without_copies_reports_zero_followers() -> None:
    report = LoadReport.parse(LoadReporter(3).report([], now=1.0))
    assert report is not None
    assert (report.followed_topics, report.follower_message_rate, report.follower_throughput_mbps) == (
        0,
        0,
        0,
    )
