"""Automated rebalancing (docs/architecture.md §13): the `load_manager.rebalancing` settings and the planner
that picks at most one topic move per check. Pure and deterministic: load reports, topic ages, the move
history and the current time are passed in; the caller persists the history and executes a move through
the unload path (an unload marker naming `to_broker`, so the owner seals before the target loads;
`Move.marker()` gives the plain `rebalance` marker, which `BrokerSelector.choose` also honours), never by
deleting the topic. The caller passes as `owners` only topics that are not already moving.

Rules, in order (Danube's load-manager specification, with Danube's faults fixed):

1. At least `min_brokers_for_rebalance` *active* brokers (Danube counted inactive ones too).
2. Imbalance over the active brokers' ranking scores; rebalance only if CV > the level's threshold.
3. Pacing, from the history: fewer than `max_moves_per_hour` moves in the last hour, and none within
   `cooldown_seconds` (Danube slept after a move instead, and a manual trigger bypassed the hourly cap).
4. Sources: the overloaded brokers, most loaded first. When none is overloaded (two brokers never are, and
   after a broker joins only the newcomer stands out as underloaded) every broker above the mean is a source,
   most loaded first: otherwise the specification's own "add brokers" scenario would never rebalance.
5. Candidates on a source: topics its report lists that it still owns, not blacklisted, at least
   `min_topic_age_seconds` old (from their first-seen time), and not moved within max(cooldown, min topic
   age): a moved topic is young again on its new broker, so it can never bounce back within the cooldown.
   Lightest first by the topic load score (`load.topic_load_score`). Only led topics move: a broker's
   follower copies count in its score (`load.follower_load`) but follow the replica records, not moves.
6. Target: the least loaded active broker other than the source. The move is made only if it narrows the
   gap: the topic's estimated share of the source's score is smaller than the source/target difference
   (so the pair's spread shrinks and moves cannot ping-pong). If the lightest candidate does not fit, the
   next source is tried.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal

import msgspec

from ister.core.cluster.assignment import Marker, Rankings
from ister.core.cluster.load import (
    Imbalance,
    LoadReport,
    Strategy,
    TopicLoad,
    imbalance_of,
    place_topic,
    rank,
    topic_load_score,
    weighted_topic_load,
)
from ister.errors import ConfigError

Aggressiveness = Literal["conservative", "balanced", "aggressive"]
HOUR = 3600.0
MOVE_REASON = "LoadImbalance"  # the history entry's reason, as Danube writes it
MARKER_REASON = "rebalance"  # the unassigned marker's reason


@dataclass(frozen=True, slots=True)
class Level:
    cv_threshold: float  # a fraction: 0.30 is 30 %
    check_interval_seconds: int
    max_moves_per_hour: int


LEVELS: dict[str, Level] = {
    "conservative": Level(0.40, 600, 5),
    "balanced": Level(0.30, 300, 10),
    "aggressive": Level(0.20, 120, 20),
}

_PREFIX = "load_manager.rebalancing"
_BOUNDS: dict[str, tuple[int, int]] = {
    "check_interval_seconds": (1, 86_400),
    "max_moves_per_hour": (1, 3_600),
    "cooldown_seconds": (0, 86_400),
    "min_brokers_for_rebalance": (2, 100_000),
    "min_topic_age_seconds": (0, 7 * 86_400),
}
_SEGMENT = re.compile(r"[^/\s]+")


@functools.lru_cache(maxsize=1024)
def _pattern(pattern: str) -> re.Pattern[str]:
    return re.compile("[^/]*".join(re.escape(part) for part in pattern.split("*")))


def blacklisted(topic: str, patterns: Sequence[str]) -> bool:
    """Whether `topic` matches a blacklist pattern: the name itself, or with `*` standing for any run of
    characters within one name segment (`/system/*`, `/default/critical-*`, `/*/audit`)."""
    return any(_pattern(p).fullmatch(topic) for p in patterns)


def check_pattern(pattern: Any) -> str:
    """A valid blacklist pattern is `/namespace/topic`, either part possibly with `*`s."""
    parts = pattern.split("/") if isinstance(pattern, str) else []
    if len(parts) != 3 or parts[0] or not all(_SEGMENT.fullmatch(p) for p in parts[1:]):
        raise ConfigError(
            f"{_PREFIX}.blacklist_topics: {pattern!r} is not a topic pattern; expected /namespace/topic "
            "where '*' matches any characters within a part (e.g. /system/* or /default/critical-*)"
        )
    return pattern  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True)
class RebalanceConfig:
    """The `load_manager.rebalancing` block. Build it with `from_mapping` (the YAML block, missing keys take
    the level's defaults) or `preset`; the constructor validates and raises ConfigError."""

    enabled: bool = False
    aggressiveness: Aggressiveness = "balanced"
    check_interval_seconds: int = 300
    max_moves_per_hour: int = 10
    cooldown_seconds: int = 60
    min_brokers_for_rebalance: int = 2
    min_topic_age_seconds: int = 300
    blacklist_topics: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ConfigError(f"{_PREFIX}.enabled must be true or false, got {self.enabled!r}")
        if not isinstance(self.aggressiveness, str) or self.aggressiveness not in LEVELS:
            raise ConfigError(
                f"{_PREFIX}.aggressiveness must be one of {', '.join(LEVELS)}, got {self.aggressiveness!r}"
            )
        for name, (low, high) in _BOUNDS.items():
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ConfigError(f"{_PREFIX}.{name} must be an integer, got {value!r}")
            if not low <= value <= high:
                raise ConfigError(f"{_PREFIX}.{name} must be in {low}..{high}, got {value}")
        patterns = self.blacklist_topics
        if isinstance(patterns, str) or not isinstance(patterns, Sequence):
            raise ConfigError(
                f"{_PREFIX}.blacklist_topics must be a list of topic patterns, got {patterns!r}"
            )
        object.__setattr__(self, "blacklist_topics", tuple(check_pattern(p) for p in patterns))

    @classmethod
    def preset(cls, aggressiveness: Aggressiveness = "balanced", **overrides: Any) -> RebalanceConfig:
        """The level's threshold, check interval and hourly cap, with `overrides` on top."""
        level = LEVELS.get(aggressiveness)
        defaults: dict[str, Any] = {"aggressiveness": aggressiveness}
        if level is not None:
            defaults["check_interval_seconds"] = level.check_interval_seconds
            defaults["max_moves_per_hour"] = level.max_moves_per_hour
        return cls(**{**defaults, **overrides})

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None) -> RebalanceConfig:
        """From the YAML block (None: the defaults, rebalancing disabled). Unknown keys are errors."""
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise ConfigError(f"{_PREFIX} must be a mapping, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(str(k) for k in data if k not in known)
        if unknown:
            raise ConfigError(
                f"{_PREFIX}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        values = dict(data)
        level = values.pop("aggressiveness", "balanced")
        if not isinstance(level, str) or level not in LEVELS:
            raise ConfigError(f"{_PREFIX}.aggressiveness must be one of {', '.join(LEVELS)}, got {level!r}")
        if "blacklist_topics" in values and values["blacklist_topics"] is None:
            values["blacklist_topics"] = ()
        return cls.preset(level, **values)  # type: ignore[arg-type]

    @property
    def cv_threshold(self) -> float:
        return LEVELS[self.aggressiveness].cv_threshold

    @property
    def recent_move_window(self) -> int:
        """A topic moved less than this long ago is not moved again."""
        return max(self.cooldown_seconds, self.min_topic_age_seconds)

    def is_blacklisted(self, topic: str) -> bool:
        return blacklisted(topic, self.blacklist_topics)


class Move(msgspec.Struct, frozen=True, kw_only=True):
    """One planned move; also the history entry (`/cluster/rebalancing_history/{ts}`) once executed."""

    topic: str
    from_broker: int
    to_broker: int
    reason: str = MOVE_REASON
    estimated_load: float = 0.0  # the topic's load score (`load.topic_load_score`)
    timestamp: float = 0.0  # when it was planned (the `now` given to the planner), seconds

    def marker(self) -> Marker:
        """The unassigned marker that makes the leader hand the topic to `to_broker` after its unload."""
        return Marker(reason=MARKER_REASON, from_broker=self.from_broker, to_broker=self.to_broker)

    def to_json(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)  # type: ignore[no-any-return]

    @classmethod
    def parse(cls, value: Any) -> Move | None:
        """Lenient: a history entry that is not a valid move gives None."""
        try:
            if isinstance(value, bytes | bytearray | str):
                value = msgspec.json.decode(value)
            move = msgspec.convert(value, cls)
        except (msgspec.ValidationError, msgspec.DecodeError):
            return None
        if min(move.from_broker, move.to_broker) < 0 or not math.isfinite(move.timestamp):
            return None
        return move


Status = Literal[
    "move", "disabled", "too_few_brokers", "balanced", "rate_limited", "cooldown", "no_candidate"
]


@dataclass(frozen=True, slots=True)
class Decision:
    status: Status
    detail: str  # a sentence for logs and the admin API
    imbalance: Imbalance
    rankings: Rankings
    move: Move | None = None


@dataclass(frozen=True, slots=True)
class DryRun:
    moves: list[Move]  # in order; the first is what `plan` would do now if pacing allowed it
    before: Imbalance
    after: Imbalance  # projected, with each topic's estimated share of its source's score moved
    detail: str


def moves_in_last_hour(history: Sequence[Move], now: float) -> int:
    """Moves planned less than an hour before `now` (entries from the future count: clocks differ)."""
    return sum(1 for m in history if now - m.timestamp < HOUR)


class RebalancePlanner:
    """Decides rebalancing moves for one assignment strategy. Stateless between calls."""

    def __init__(self, config: RebalanceConfig, strategy: Strategy = "balanced") -> None:
        self.config = config
        self.strategy = strategy

    def next_allowed(self, history: Sequence[Move], now: float) -> float:
        """The earliest time pacing (cooldown and hourly cap) allows another move; `now` if it does now."""
        at = now
        if history:
            at = max(at, max(m.timestamp for m in history) + self.config.cooldown_seconds)
        recent = sorted(m.timestamp for m in history if now - m.timestamp < HOUR)
        excess = len(recent) - self.config.max_moves_per_hour
        if excess >= 0:
            at = max(at, recent[excess] + HOUR)
        return at

    def plan(
        self,
        reports: Mapping[int, LoadReport],
        active: Collection[int],
        first_seen: Mapping[str, float],
        history: Sequence[Move],
        now: float,
        owners: Mapping[str, int] | None = None,
        manual: bool = False,
    ) -> Decision:
        """At most one move for this check.

        `reports`: the latest load report per broker (the leader's view); active brokers without one count as
        empty. `first_seen`: when each topic was first seen (a topic missing here is never moved).
        `history`: the moves made so far (any older than an hour or the cooldown may be dropped).
        `owners`: the current assignments, if known; a topic is only moved off the broker that owns it.
        `manual`: an operator's trigger, which runs even when rebalancing is disabled (pacing still applies).
        """
        cfg = self.config
        view, rankings, loads = self._view(reports, active)
        imb = imbalance_of(loads)

        def decide(status: Status, detail: str, move: Move | None = None) -> Decision:
            return Decision(status, detail, imb, rankings, move)

        if not cfg.enabled and not manual:
            return decide("disabled", "rebalancing is disabled")
        gate = self._gate(imb)
        if gate is not None:
            return decide(*gate)
        recent = moves_in_last_hour(history, now)
        if recent >= cfg.max_moves_per_hour:
            return decide("rate_limited", f"{recent} moves in the last hour (max {cfg.max_moves_per_hour})")
        last = max((m.timestamp for m in history), default=None)
        if last is not None and now - last < cfg.cooldown_seconds:
            return decide("cooldown", f"last move {now - last:g}s ago (cooldown {cfg.cooldown_seconds}s)")
        move = self._select(view, loads, imb, first_seen, history, now, owners, frozenset())
        if move is None:
            return decide("no_candidate", "no movable topic narrows the imbalance")
        return decide("move", f"move {move.topic} from {move.from_broker} to {move.to_broker}", move)

    def dry_run(
        self,
        reports: Mapping[int, LoadReport],
        active: Collection[int],
        first_seen: Mapping[str, float],
        history: Sequence[Move],
        now: float,
        owners: Mapping[str, int] | None = None,
        max_moves: int | None = None,
    ) -> DryRun:
        """The moves rebalancing would make, in order, until the projected CV is at or below the threshold or
        no candidate is left: each topic at most once, `max_moves` at most (default: the hourly cap). Pacing
        (cooldown, moves already made this hour) and `enabled` are ignored: this says what, not when."""
        view, _, loads = self._view(reports, active)
        before = imb = imbalance_of(loads)
        limit = self.config.max_moves_per_hour if max_moves is None else max_moves
        gate = self._gate(imb)
        moves: list[Move] = []
        while gate is None and len(moves) < limit:
            moved = frozenset(m.topic for m in moves)
            move = self._select(view, loads, imb, first_seen, history, now, owners, moved)
            if move is None:
                break
            delta = self._share(view[move.from_broker], loads[move.from_broker], move.topic)
            loads[move.from_broker] -= delta
            loads[move.to_broker] += delta
            view = place_topic(view, move.topic, move.to_broker)
            moves.append(move)
            imb = imbalance_of(loads)
            gate = self._gate(imb)
        detail = (
            gate[1] if gate is not None else ("no candidate left" if len(moves) < limit else "move limit")
        )
        return DryRun(moves, before, imb, detail)

    # -- internals -----------------------------------------------------------------------------------------
    def _view(
        self, reports: Mapping[int, LoadReport], active: Collection[int]
    ) -> tuple[dict[int, LoadReport], Rankings, dict[int, float]]:
        view = dict(reports)
        for b in active:
            if b not in view:
                view[b] = LoadReport.empty(b)
        rankings = rank(self.strategy, view)
        return view, rankings, {b: float(s) for b, s in rankings if b in active}

    def _gate(self, imb: Imbalance) -> tuple[Status, str] | None:
        cfg = self.config
        if imb.broker_count < cfg.min_brokers_for_rebalance:
            return (
                "too_few_brokers",
                f"{imb.broker_count} active brokers (need {cfg.min_brokers_for_rebalance})",
            )
        if imb.cv <= cfg.cv_threshold:
            return ("balanced", f"cluster is balanced (CV {imb.cv:.1%}, threshold {cfg.cv_threshold:.0%})")
        return None

    def _share(self, report: LoadReport, load: float, topic: str) -> float:
        """How much of the broker's score moving `topic` away is estimated to take: one topic under Fair,
        otherwise the topic's part of the broker's topic load (its follower copies included: they stay)
        applied to the whole score."""
        if self.strategy == "fair":
            return 1.0
        entry = report.topic(topic)
        total = weighted_topic_load(report)
        if entry is None or total <= 0:
            return 0.0
        return load * topic_load_score(entry) / total

    def _eligible(
        self,
        topic: TopicLoad,
        source: int,
        first_seen: Mapping[str, float],
        recently_moved: Collection[str],
        owners: Mapping[str, int] | None,
        now: float,
    ) -> bool:
        name = topic.topic_name
        if name in recently_moved or self.config.is_blacklisted(name):
            return False
        if owners is not None and owners.get(name) != source:
            return False
        seen = first_seen.get(name)
        return seen is not None and now - seen >= self.config.min_topic_age_seconds

    def _select(
        self,
        view: Mapping[int, LoadReport],
        loads: Mapping[int, float],
        imb: Imbalance,
        first_seen: Mapping[str, float],
        history: Sequence[Move],
        now: float,
        owners: Mapping[str, int] | None,
        exclude: frozenset[str],
    ) -> Move | None:
        window = self.config.recent_move_window
        recently_moved = exclude | {m.topic for m in history if now - m.timestamp < window}
        by_load = sorted(loads, key=lambda b: (-loads[b], b))
        sources = list(imb.overloaded) or [b for b in by_load if loads[b] > imb.mean]
        targets = sorted(loads, key=lambda b: (loads[b], b))
        for source in sources:
            target = next((b for b in targets if b != source), None)
            if target is None:
                return None
            report = view[source]
            candidates = sorted(
                (
                    t
                    for t in report.topics
                    if self._eligible(t, source, first_seen, recently_moved, owners, now)
                ),
                key=lambda t: (topic_load_score(t), t.topic_name),
            )
            if not candidates:
                continue
            lightest = candidates[0]
            # Heavier candidates take a larger share, so if the lightest does not fit none does.
            if self._share(report, loads[source], lightest.topic_name) < loads[source] - loads[target]:
                return Move(
                    topic=lightest.topic_name,
                    from_broker=source,
                    to_broker=target,
                    estimated_load=topic_load_score(lightest),
                    timestamp=now,
                )
        return None
