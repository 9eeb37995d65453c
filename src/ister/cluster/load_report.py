"""The load report each cluster broker writes to `/cluster/load/{broker_id}` (docs/architecture.md §13;
fields as Danube v0.15's report): resource usage from psutil, per-topic rates and client counts, totals;
and, an Ister extension, the totals of its follower copies of replicated topics (count and the rates their
records are appended at).

Rates are deltas of cumulative counters between two reports divided by the elapsed time; the first
report of a topic (or of a copy) has rate 0.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ister.core.cluster.load import RateTracker
from ister.ports.host import TopicStats


@dataclass
class _Sample:
    at: float
    messages: int
    bytes: int


@dataclass
class LoadReporter:
    broker_id: int
    durable_tier: bool = True  # shown in the report: without one, moves of reliable topics are refused
    _topics: dict[str, _Sample] = field(default_factory=dict)
    _io: tuple[float, int, int] | None = None  # (time, disk bytes, net bytes)
    _followed: RateTracker = field(default_factory=RateTracker)

    def report(
        self,
        topics: Iterable[tuple[str, TopicStats, int]],
        now: float | None = None,
        followed: Iterable[tuple[str, int, int]] = (),
    ) -> dict[str, Any]:
        """The report for these (name, topic, backlog) and these follower copies (name, records appended,
        bytes appended: cumulative) now; call it once per interval."""
        now = time.monotonic() if now is None else now
        copies = 0
        copy_msgs = copy_bytes = 0.0
        names: set[str] = set()
        for name, records, size in followed:
            names.add(name)
            rates = self._followed.update(name, records, size, now)
            copies += 1
            copy_msgs += rates.messages_per_second
            copy_bytes += rates.bytes_per_second
        self._followed.retain(names)
        loads: list[dict[str, Any]] = []
        seen: set[str] = set()
        for name, topic, backlog in topics:
            seen.add(name)
            prev = self._topics.get(name)
            elapsed = now - prev.at if prev is not None else 0.0
            msg_rate = (topic.messages_in - prev.messages) / elapsed if prev and elapsed >= 0.1 else 0.0
            byte_rate = (topic.bytes_in - prev.bytes) / elapsed if prev and elapsed >= 0.1 else 0.0
            self._topics[name] = _Sample(now, topic.messages_in, topic.bytes_in)
            consumers = sum(len(getattr(s, "consumers", ())) for s in topic.subscriptions.values())
            loads.append(
                {
                    "topic_name": name,
                    "message_rate": round(max(msg_rate, 0.0)),
                    "byte_rate": round(max(byte_rate, 0.0)),
                    "byte_rate_mbps": max(byte_rate, 0.0) / 1_000_000,
                    "producer_count": len(topic.producers),
                    "consumer_count": consumers,
                    "subscription_count": len(topic.subscriptions),
                    "backlog_messages": max(backlog, 0),
                }
            )
        for gone in set(self._topics) - seen:
            del self._topics[gone]
        return {
            "resources_usage": self._resources(now),
            "topics": loads,
            "total_throughput_mbps": sum(t["byte_rate_mbps"] for t in loads),
            "total_message_rate": sum(t["message_rate"] for t in loads),
            "total_lag_messages": sum(t["backlog_messages"] for t in loads),
            "timestamp": int(time.time()),
            "broker_id": self.broker_id,
            "durable_tier": self.durable_tier,
            "followed_topics": copies,
            "follower_message_rate": round(max(copy_msgs, 0.0)),
            "follower_byte_rate": round(max(copy_bytes, 0.0)),
            "follower_throughput_mbps": max(copy_bytes, 0.0) / 1_000_000,
        }

    def _resources(self, now: float) -> list[dict[str, Any]]:
        import psutil  # here, not at the top: standalone brokers never report and skip its ~0.07 s import

        usage: list[dict[str, Any]] = [
            {"resource": "CPU", "usage": float(psutil.cpu_percent(interval=None))},
            {"resource": "Memory", "usage": float(psutil.virtual_memory().percent)},
        ]
        disk = psutil.disk_io_counters()
        net = psutil.net_io_counters()
        if disk is not None and net is not None:
            disk_bytes = disk.read_bytes + disk.write_bytes
            net_bytes = net.bytes_sent + net.bytes_recv
            if self._io is not None and now - self._io[0] >= 0.1:
                elapsed = now - self._io[0]
                usage.append({"resource": "DiskIO", "usage": max(disk_bytes - self._io[1], 0) / elapsed})
                usage.append({"resource": "NetworkIO", "usage": max(net_bytes - self._io[2], 0) / elapsed})
            self._io = (now, disk_bytes, net_bytes)
        return usage
