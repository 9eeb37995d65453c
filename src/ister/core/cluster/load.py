"""Broker load (docs/architecture.md §13): the report each broker writes at `/cluster/load/{broker_id}`,
the per-second rates it is built from, the three ranking strategies and the cluster's imbalance metrics.
Pure: times are passed in.

Scores are integers, lower is less loaded, ties broken by broker id, so the rankings plug straight into
`BrokerSelector.choose`. Where Danube's load-manager specification and Danube's code differ the
specification wins (see each function; docs/architecture.md §13 gives the formulas).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec

from ister.core.cluster.assignment import Rankings, fair_rankings

CPU = "CPU"
MEMORY = "Memory"
DISK_IO = "DiskIO"
NETWORK_IO = "NetworkIO"
RESOURCES = (CPU, MEMORY, DISK_IO, NETWORK_IO)

Strategy = Literal["fair", "balanced", "weighted_load"]
STRATEGIES: tuple[Strategy, ...] = ("fair", "balanced", "weighted_load")

BYTES_PER_MB = 1_000_000  # byte_rate_mbps is MB/s (bytes / 1e6), as Danube computes it
BACKLOG_UNIT = 10_000  # backlog messages per unit of topic load
BOTTLENECK = 0.7  # WeightedLoad: a normalised metric above this is the broker's bottleneck
# A follower copy costs its broker the leader's disk work (append, fsync) and the network in, but no producer
# or consumer connections and no dispatch: half of what a led topic with the same traffic weighs.
FOLLOWER_WEIGHT = 0.5
FOLLOWER_FIELDS = (
    "followed_topics",
    "follower_message_rate",
    "follower_byte_rate",
    "follower_throughput_mbps",
)

NonNegInt = Annotated[int, msgspec.Meta(ge=0)]
NonNegFloat = Annotated[float, msgspec.Meta(ge=0)]


class ResourceUsage(msgspec.Struct, frozen=True, kw_only=True):
    resource: str  # one of RESOURCES; others are kept but ignored by the rankings
    usage: NonNegFloat  # CPU/Memory: percent 0-100; DiskIO/NetworkIO: bytes per second


class TopicLoad(msgspec.Struct, frozen=True, kw_only=True):
    topic_name: str
    message_rate: NonNegInt = 0  # messages per second
    byte_rate: NonNegInt = 0  # bytes per second
    byte_rate_mbps: NonNegFloat = 0.0  # byte_rate / 1e6
    producer_count: NonNegInt = 0
    consumer_count: NonNegInt = 0
    subscription_count: NonNegInt = 0
    backlog_messages: NonNegInt = 0

    @classmethod
    def build(
        cls,
        topic_name: str,
        message_rate: float = 0.0,
        byte_rate: float = 0.0,
        producer_count: int = 0,
        consumer_count: int = 0,
        subscription_count: int = 0,
        backlog_messages: int = 0,
    ) -> TopicLoad:
        """A topic's entry from its per-second rates (rounded to whole numbers, as on the wire)."""
        return cls(
            topic_name=topic_name,
            message_rate=max(0, round(message_rate)),
            byte_rate=max(0, round(byte_rate)),
            byte_rate_mbps=max(0.0, float(byte_rate)) / BYTES_PER_MB,
            producer_count=producer_count,
            consumer_count=consumer_count,
            subscription_count=subscription_count,
            backlog_messages=backlog_messages,
        )

    @property
    def connections(self) -> int:
        return self.producer_count + self.consumer_count


class LoadReport(msgspec.Struct, frozen=True, kw_only=True):
    broker_id: NonNegInt
    resources_usage: list[ResourceUsage] = msgspec.field(default_factory=list)
    topics: list[TopicLoad] = msgspec.field(default_factory=list)  # the topics it leads (owns)
    total_throughput_mbps: NonNegFloat = 0.0
    total_message_rate: NonNegInt = 0
    total_lag_messages: NonNegInt = 0
    timestamp: NonNegInt = 0  # unix seconds
    # Ister extension: the follower copies of replicated topics it keeps (0 in Danube's and older reports).
    # Totals only: a per-topic list would repeat the leaders' entries (a copy replicates what its leader
    # takes in) and make the report RF times larger.
    followed_topics: NonNegInt = 0
    follower_message_rate: NonNegInt = 0  # records per second appended to its copies
    follower_byte_rate: NonNegInt = 0  # bytes per second appended to its copies
    follower_throughput_mbps: NonNegFloat = 0.0  # follower_byte_rate / 1e6

    @classmethod
    def build(
        cls,
        broker_id: int,
        timestamp: float,
        topics: Iterable[TopicLoad] = (),
        cpu: float = 0.0,
        memory: float = 0.0,
        disk_io: float | None = None,
        network_io: float | None = None,
        followed_topics: int = 0,
        follower_rates: Rates | None = None,
    ) -> LoadReport:
        """A report with its totals computed from the topics. CPU and memory are percentages (clamped);
        `follower_rates`: what this broker's follower copies append, all together."""
        resources = [
            ResourceUsage(resource=CPU, usage=_pct(cpu)),
            ResourceUsage(resource=MEMORY, usage=_pct(memory)),
        ]
        for name, value in ((DISK_IO, disk_io), (NETWORK_IO, network_io)):
            if value is not None:
                resources.append(ResourceUsage(resource=name, usage=max(float(value), 0.0)))
        follower = follower_rates or Rates()
        return cls(
            broker_id=broker_id,
            resources_usage=resources,
            timestamp=max(0, int(timestamp)),
            followed_topics=max(0, followed_topics),
            follower_message_rate=max(0, round(follower.messages_per_second)),
            follower_byte_rate=max(0, round(follower.bytes_per_second)),
            follower_throughput_mbps=max(0.0, follower.bytes_per_second) / BYTES_PER_MB,
        )._retotal(list(topics))

    @classmethod
    def empty(cls, broker_id: int, timestamp: float = 0) -> LoadReport:
        """What the leader assumes for a registered broker that has not reported yet."""
        return cls(broker_id=broker_id, timestamp=max(0, int(timestamp)))

    @classmethod
    def parse(cls, value: Any) -> LoadReport | None:
        """Lenient: JSON bytes/str or a decoded value; missing lists and totals default, unknown fields are
        ignored, anything malformed (wrong types, negative or non-finite numbers) gives None. Never raises."""
        try:
            if isinstance(value, bytes | bytearray | memoryview | str):
                value = msgspec.json.decode(value)
            report = msgspec.convert(value, cls)
        except (msgspec.ValidationError, msgspec.DecodeError):
            return None
        floats = [
            report.total_throughput_mbps,
            report.follower_throughput_mbps,
            *(r.usage for r in report.resources_usage),
        ]
        floats += [t.byte_rate_mbps for t in report.topics]
        return report if all(math.isfinite(f) for f in floats) else None

    def to_json(self) -> dict[str, Any]:
        """As Danube writes it; the follower fields only when the broker keeps copies."""
        out: dict[str, Any] = msgspec.to_builtins(self)
        if not self.followed_topics:
            for name in FOLLOWER_FIELDS:
                if not out[name]:
                    del out[name]
        return out

    def usage(self, resource: str) -> float:
        """The last entry for `resource`, 0.0 when the broker did not report it."""
        found = [r.usage for r in self.resources_usage if r.resource == resource]
        return found[-1] if found else 0.0

    @property
    def cpu(self) -> float:
        return self.usage(CPU)

    @property
    def memory(self) -> float:
        return self.usage(MEMORY)

    @property
    def topic_count(self) -> int:
        return len(self.topics)

    def topic(self, name: str) -> TopicLoad | None:
        return next((t for t in self.topics if t.topic_name == name), None)

    def with_topics(self, topics: list[TopicLoad]) -> LoadReport:
        """The same report hosting `topics` (totals recomputed; resource usage unchanged)."""
        return self._retotal(topics)

    def _retotal(self, topics: list[TopicLoad]) -> LoadReport:
        return msgspec.structs.replace(
            self,
            topics=topics,
            total_throughput_mbps=sum(t.byte_rate_mbps for t in topics),
            total_message_rate=sum(t.message_rate for t in topics),
            total_lag_messages=sum(t.backlog_messages for t in topics),
        )


def place_topic(reports: Mapping[int, LoadReport], topic: str, broker: int | None) -> dict[int, LoadReport]:
    """The leader's view right after it (re)assigns `topic` to `broker` (None: the topic is unassigned).

    The topic leaves every other report and joins `broker`'s with the load last reported for it (zero when
    it is new), so the next ranking counts it before the owners publish fresh reports.
    """
    entry: TopicLoad | None = None
    out: dict[int, LoadReport] = {}
    for b, report in reports.items():
        kept = [t for t in report.topics if t.topic_name != topic]
        if len(kept) != len(report.topics):
            entry = entry or report.topic(topic)
            report = report.with_topics(kept)
        out[b] = report
    if broker is not None:
        base = out.get(broker) or LoadReport.empty(broker)
        out[broker] = base.with_topics([*base.topics, entry or TopicLoad(topic_name=topic)])
    return out


# -- rates -------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Rates:
    messages_per_second: float = 0.0
    bytes_per_second: float = 0.0


@dataclass(slots=True)
class _Sample:
    time: float
    messages: int
    bytes: int
    rates: Rates


class RateTracker:
    """Per-key rates from cumulative counters (messages and bytes in), between two samples.

    The first sample of a key gives zero rates. Samples closer than `min_interval` seconds to the previous
    one return the previous rates and keep the older baseline (so the next rate spans the longer interval).
    A counter that went down (the topic was reloaded) or a clock that went back restarts the baseline; the
    counters that went down count from zero over the elapsed time.
    """

    def __init__(self, min_interval: float = 0.1) -> None:
        self.min_interval = min_interval
        self._samples: dict[str, _Sample] = {}

    def update(self, key: str, messages: int, bytes_in: int, now: float) -> Rates:
        last = self._samples.get(key)
        if last is None or now < last.time:
            rates = last.rates if last is not None else Rates()
            self._samples[key] = _Sample(now, messages, bytes_in, rates)
            return rates
        elapsed = now - last.time
        if elapsed < self.min_interval:
            return last.rates
        # A counter below its baseline restarted from zero at some point in the interval.
        d_msgs = messages - last.messages if messages >= last.messages else messages
        d_bytes = bytes_in - last.bytes if bytes_in >= last.bytes else bytes_in
        rates = Rates(d_msgs / elapsed, d_bytes / elapsed)
        self._samples[key] = _Sample(now, messages, bytes_in, rates)
        return rates

    def rates(self, key: str) -> Rates:
        sample = self._samples.get(key)
        return sample.rates if sample is not None else Rates()

    def retain(self, keys: Collection[str]) -> None:
        """Forget every key not in `keys` (topics this broker no longer hosts)."""
        for key in [k for k in self._samples if k not in keys]:
            del self._samples[key]

    def forget(self, key: str) -> None:
        self._samples.pop(key, None)


# -- rankings ----------------------------------------------------------------------------------------------
def topic_load_score(topic: TopicLoad) -> float:
    """Specification: 0.2·topic_count + 0.3·throughput_mbps + 0.3·connections + 0.2·backlog/10000, for one
    topic.

    (Danube's code drops the count term and weighs MB/s 0.5; the specification's formula is used.)
    """
    return (
        0.2
        + 0.3 * topic.byte_rate_mbps
        + 0.3 * topic.connections
        + 0.2 * topic.backlog_messages / BACKLOG_UNIT
    )


def led_topic_load(report: LoadReport) -> float:
    """The sum of the load scores of the topics the broker leads (0 without topics)."""
    return sum(topic_load_score(t) for t in report.topics)


def follower_load(report: LoadReport) -> float:
    """The broker's follower copies, scored like led topics (0.2 per copy + 0.3·MB/s appended) without the
    connection and backlog terms (a copy has neither), times FOLLOWER_WEIGHT."""
    return FOLLOWER_WEIGHT * (0.2 * report.followed_topics + 0.3 * report.follower_throughput_mbps)


def weighted_topic_load(report: LoadReport) -> float:
    """The specification's weighted topic load of a broker: the sum of its topics' load scores, plus (an
    Ister extension) its follower copies' `follower_load`.

    The specification writes the backlog term as `backlog * 0.2` here and `backlog/10000 * 0.2` for topic
    scores; both use the /10000 scale so a broker's topic load is exactly the sum of its topics' scores.
    """
    return led_topic_load(report) + follower_load(report)


def fair_count(report: LoadReport) -> int:
    """Fair's score: the topics it leads, plus FOLLOWER_WEIGHT per follower copy (rounded down)."""
    return report.topic_count + math.floor(FOLLOWER_WEIGHT * report.followed_topics)


def broker_throughput_mbps(report: LoadReport) -> float:
    """What the broker takes in, MB/s: its led topics', plus FOLLOWER_WEIGHT times its copies'."""
    return report.total_throughput_mbps + FOLLOWER_WEIGHT * report.follower_throughput_mbps


def rank_fair(reports: Mapping[int, LoadReport]) -> Rankings:
    """Fair: score = number of topics led, plus half a topic per follower copy (`fair_count`)."""
    return fair_rankings({b: fair_count(r) for b, r in reports.items()})


def _ranked(scores: Mapping[int, float]) -> Rankings:
    return sorted(
        ((b, max(0, math.trunc(s))) for b, s in scores.items()), key=lambda item: (item[1], item[0])
    )


def rank_balanced(reports: Mapping[int, LoadReport]) -> Rankings:
    """Balanced: trunc(0.3·weighted_topic_load + 0.35·CPU% + 0.35·Memory%).

    When no broker reports any CPU or memory usage (no resource monitor) the score is Fair's (the topic
    count, as in Danube, plus the follower copies): otherwise the truncation would flatten every broker to
    (nearly) zero.
    """
    if not any(_pct(r.cpu) > 0 or _pct(r.memory) > 0 for r in reports.values()):
        return rank_fair(reports)
    return _ranked(
        {
            b: 0.3 * weighted_topic_load(r) + 0.35 * _pct(r.cpu) + 0.35 * _pct(r.memory)
            for b, r in reports.items()
        }
    )


def _pct(value: float) -> float:
    return min(max(float(value), 0.0), 100.0)


def weighted_load_metrics(reports: Mapping[int, LoadReport]) -> dict[int, tuple[float, float, float, float]]:
    """Each broker's normalised (CPU, memory, throughput, topic load), all in 0..1; throughput and topic
    load count follower copies at FOLLOWER_WEIGHT.

    CPU and memory are utilisations (percent / 100). Throughput and topic load have no capacity, so they are
    relative to the cluster's largest value, which is floored at 1 (1 MB/s, 1 load unit) so that an almost
    idle cluster does not look saturated.
    """
    max_thr = max([1.0, *(broker_throughput_mbps(r) for r in reports.values())])
    max_w = max([1.0, *(weighted_topic_load(r) for r in reports.values())])
    return {
        b: (
            _pct(r.cpu) / 100,
            _pct(r.memory) / 100,
            broker_throughput_mbps(r) / max_thr,
            weighted_topic_load(r) / max_w,
        )
        for b, r in reports.items()
    }


def weighted_load_score(metrics: Sequence[float]) -> float:
    """WeightedLoad for one broker: if its bottleneck (largest normalised metric) is above 70 % it
    weighs 50 % and the others share the rest evenly; otherwise every metric weighs the same (25 % each)."""
    bottleneck = max(metrics)
    if bottleneck > BOTTLENECK and len(metrics) > 1:
        return 0.5 * bottleneck + 0.5 * (sum(metrics) - bottleneck) / (len(metrics) - 1)
    return sum(metrics) / len(metrics)


def rank_weighted_load(reports: Mapping[int, LoadReport]) -> Rankings:
    """WeightedLoad: score = trunc(100 · weighted_load_score(normalised metrics))."""
    return _ranked({b: 100 * weighted_load_score(m) for b, m in weighted_load_metrics(reports).items()})


def rank(strategy: Strategy, reports: Mapping[int, LoadReport]) -> Rankings:
    if strategy == "fair":
        return rank_fair(reports)
    if strategy == "balanced":
        return rank_balanced(reports)
    if strategy == "weighted_load":
        return rank_weighted_load(reports)
    raise ValueError(f"unknown assignment strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}")


# -- follower placement ------------------------------------------------------------------------------------
def replica_placement_load(report: LoadReport | None, copies: int) -> float:
    """A broker's load when choosing where a new follower copy goes: its led topics' load from its report
    plus `follower_load` with `copies`, the copies it follows as the replica records say now (the report's
    count can be one interval old: a burst of new topics must not all pick the same broker)."""
    if report is None:
        return FOLLOWER_WEIGHT * 0.2 * copies
    current = msgspec.structs.replace(report, followed_topics=copies)
    return led_topic_load(report) + follower_load(current)


def rank_replica_candidates(
    candidates: Iterable[int],
    prefer: Collection[int],
    reports: Mapping[int, LoadReport],
    copies: Mapping[int, int],
) -> list[int]:
    """Where follower copies go, best first: brokers in `prefer` (they already hold a copy), then the least
    loaded by `replica_placement_load` (led and followed work, not only the number of copies), then the
    fewest copies, then by id. `copies`: broker -> follower copies it holds per the replica records."""
    return sorted(
        set(candidates),
        key=lambda b: (
            b not in prefer,
            replica_placement_load(reports.get(b), copies.get(b, 0)),
            copies.get(b, 0),
            b,
        ),
    )


def spread_over_zones(ranked: list[int], zones: Mapping[int, str], used: set[str], count: int) -> list[int]:
    """`count` brokers from `ranked` (best first): first one per zone not `used` yet, then the best of the
    rest. Brokers without a zone all count as one zone, so without zones this is `ranked[:count]`."""
    picked: list[int] = []
    taken = set(used)
    for b in ranked:
        if len(picked) < count and zones.get(b, "") not in taken:
            picked.append(b)
            taken.add(zones.get(b, ""))
    picked += [b for b in ranked if b not in picked][: count - len(picked)]
    return picked


# -- imbalance ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Imbalance:
    """Spread of the ranking scores over the active brokers (the specification's "Imbalance Detection")."""

    loads: dict[int, float]  # active broker -> score
    mean: float = 0.0
    std_dev: float = 0.0  # population standard deviation
    min_load: float = 0.0
    max_load: float = 0.0
    cv: float = 0.0  # std_dev / mean (a fraction: 0.255 is 25.5 %); 0 when the mean is 0
    overloaded: tuple[int, ...] = ()  # load > mean + std_dev, most loaded first
    underloaded: tuple[int, ...] = ()  # load < mean - std_dev and load < mean / 2, least loaded first

    @property
    def cv_percent(self) -> float:
        return self.cv * 100

    @property
    def broker_count(self) -> int:
        return len(self.loads)


def imbalance(rankings: Rankings, active: Collection[int]) -> Imbalance:
    """Specification: mean, population std-dev, CV = std/mean; overloaded above mean + std; underloaded below
    mean - std and below half the mean. (Danube's code floors the std and halves it when CV > 0.3; the
    specification's rule is used.)"""
    return imbalance_of({b: s for b, s in rankings if b in active})


def imbalance_of(loads: Mapping[int, float]) -> Imbalance:
    """`imbalance` over explicit loads (broker -> score), e.g. projected ones."""
    loads = dict(loads)
    if not loads:
        return Imbalance(loads={})
    n = len(loads)
    mean = sum(loads.values()) / n
    std = math.sqrt(sum((x - mean) ** 2 for x in loads.values()) / n)
    by_load = sorted(loads.items(), key=lambda item: (item[1], item[0]))
    return Imbalance(
        loads=loads,
        mean=mean,
        std_dev=std,
        min_load=float(by_load[0][1]),
        max_load=float(by_load[-1][1]),
        cv=std / mean if mean > 0 else 0.0,
        overloaded=tuple(b for b, x in sorted(by_load, key=lambda i: (-i[1], i[0])) if x > mean + std),
        underloaded=tuple(b for b, x in by_load if x < mean - std and x < mean / 2),
    )
