"""The cheap latency histogram (ister/histogram.py) and the per-topic storage/export-backlog meter."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ister.broker import metrics
from ister.broker.topic_meter import TopicMeter
from ister.core.record import StoredMessage, encode_message, publish_time_of
from ister.histogram import LatencyHistogram


class OneHistogram:
    def __init__(self, h: LatencyHistogram) -> None:
        self.h = h

    def collect(self) -> list[Any]:
        return [self.h.metric()]


def test_histogram_exports_cumulative_buckets_sum_and_count() -> None:
    h = LatencyHistogram("t_seconds", "test", buckets=(0.001, 0.01, 0.1))
    for v in (0.0005, 0.001, 0.005, 0.05, 3.0, -1.0):  # a negative duration (clock step) counts as 0
        h.observe(v)
    registry = CollectorRegistry()
    registry.register(OneHistogram(h))
    (family,) = text_string_to_metric_families(generate_latest(registry).decode())
    assert family.type == "histogram"
    samples = {(s.name, s.labels.get("le")): s.value for s in family.samples}
    assert samples[("t_seconds_bucket", "0.001")] == 3  # le is inclusive
    assert samples[("t_seconds_bucket", "0.01")] == 4
    assert samples[("t_seconds_bucket", "0.1")] == 5
    assert samples[("t_seconds_bucket", "+Inf")] == 6
    assert samples[("t_seconds_count", None)] == 6
    assert samples[("t_seconds_sum", None)] == pytest.approx(3.0565)


def test_threadsafe_histogram_loses_no_observation() -> None:
    h = LatencyHistogram("t_seconds", "test", threadsafe=True)

    def work() -> None:
        for _ in range(20_000):
            h.observe(0.002)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert h.count == 80_000


def test_histogram_names_and_buckets_are_checked() -> None:
    with pytest.raises(ValueError, match="_seconds"):
        LatencyHistogram("t_latency", "test")
    with pytest.raises(ValueError, match="ascending"):
        LatencyHistogram("t_seconds", "test", buckets=(0.1, 0.01))


def test_publish_time_is_read_without_decoding_the_rest() -> None:
    record = encode_message(
        StoredMessage(
            payload=b"x" * 50, publish_time=1234, producer_id=7, producer_name="p", attributes={"a": "b"}
        )
    )
    assert publish_time_of(record) == 1234
    assert publish_time_of(memoryview(record)) == 1234
    assert publish_time_of(b"\xc1garbage") is None


# -- TopicMeter --------------------------------------------------------------------------------


@dataclass
class FakeWal:
    committed_offset: int = 0
    first_offset: int = 0
    sizes: dict[int, int] = field(default_factory=lambda: {0: 0})  # segment first offset -> bytes
    closed: bool = False

    @property
    def segment_count(self) -> int:
        return len(self.sizes)

    def segments(self) -> list[tuple[int, Path, int]]:
        return [(first, Path(f"/wal/{first}"), size) for first, size in sorted(self.sizes.items())]


class FakeTopic:  # hashable by identity, as Topic
    def __init__(self, name: str) -> None:
        self.name = SimpleNamespace(full=name)
        self.wal = FakeWal()
        self.exporter = SimpleNamespace(descriptors=[])
        self.start_offset = 0


def fake_topic(name: str) -> Any:
    return FakeTopic(name)


def descriptor(end: int, size: int) -> Any:
    return SimpleNamespace(end_offset=end, size=size)


def test_meter_follows_storage_and_the_export_backlog() -> None:
    now = [100.0]
    meter = TopicMeter(clock=lambda: now[0])
    topic = fake_topic("/default/meter")
    name = topic.name.full
    try:
        topic.wal.committed_offset, topic.wal.sizes = 100, {0: 1000, 100: 0}
        meter.update(topic)
        meter.walk_done()
        assert metrics.end_offset.value(name) == 100
        assert metrics.wal_bytes.value(name) == 1000
        assert metrics.export_backlog_bytes.value(name) == 1000
        assert metrics.export_backlog_age.value(name) == 0  # first seen now

        now[0] = 130.0
        topic.wal.committed_offset, topic.wal.sizes = 150, {0: 1000, 100: 500}
        meter.update(topic)
        meter.walk_done()
        assert metrics.export_backlog_age.value(name) == 30  # offsets 0..99 were there at t=100
        assert metrics.export_backlog_oldest.collect()[0].samples[0].value == 30

        # The first file is exported: the backlog is the second, whose records appeared at t=130.
        now[0] = 140.0
        topic.exporter.descriptors = [descriptor(99, 800)]
        meter.update(topic)
        assert metrics.export_backlog_bytes.value(name) == 500
        assert metrics.export_backlog_age.value(name) == 10
        assert metrics.object_bytes.value(name) == 800

        # Everything exported: no backlog, no age.
        topic.exporter.descriptors = [descriptor(99, 800), descriptor(149, 400)]
        meter.update(topic)
        assert metrics.export_backlog_bytes.value(name) == 0
        assert metrics.export_backlog_age.value(name) == 0
        assert metrics.object_bytes.value(name) == 1200
    finally:
        metrics.forget_topic(name)
    assert metrics.end_offset.value(name) is None
