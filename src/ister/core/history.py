"""A checker for recorded histories of publishes, reads and deliveries (issue 39; in the spirit of Elle and
Knossos, written here): pure logic, time comes in with the events.

A chaos run (bench/chaos.py) records what its clients saw: publish attempts, the offsets the broker
acknowledged, every subscription's deliveries and consumer acks, the persisted cursors it observed, and at
the end the topics read back by offset. `check` then proves, for every acknowledged message:

- it is stored at its acknowledged offset, and no offset is ever seen (acked, read or delivered) with two
  payloads (`lost`, `conflicts`); a payload stored at more than one offset is counted (`duplicates_stored`:
  a producer's retry after an unanswered publish, allowed by at-least-once publishing);
- every live subscription got it at least once (`undelivered`), unless retention moved the topic's start
  past it (`skipped_by_retention`); redeliveries are counted (`duplicate_deliveries`);
- first deliveries keep the order the subscription type promises (Exclusive, Failover: offset order per
  topic; Key-Shared: per key; Shared: none) (`order_violations`);
- a subscription's observed cursor never goes back except by an explicit reset (`cursor_regressions`), and
  never passes an offset that exists and no consumer had acknowledged by then (`cursor_ahead`).

Offsets are per topic; a partition is its own topic here.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field

from ister.core.dispatch.types import SubType

EXAMPLES = 5  # examples kept per anomaly kind: enough to start a diagnosis, short enough to print

# The subscription types whose first deliveries must follow offset order, and over what.
ORDERED_BY_TOPIC = frozenset({SubType.EXCLUSIVE, SubType.FAILOVER})
ORDERED_BY_KEY = frozenset({SubType.KEY_SHARED})


@dataclass(frozen=True, slots=True)
class Publish:
    """A publish attempt: `payload` is unique in the history (it names the message)."""

    topic: str
    payload: bytes
    key: str | None
    time: float


@dataclass(frozen=True, slots=True)
class Acked:
    """The broker acknowledged `payload` at `offset`."""

    topic: str
    payload: bytes
    offset: int
    time: float


@dataclass(frozen=True, slots=True)
class Subscription:
    """A subscription the history follows. `first_offset`: the first offset it owes its consumers (where it
    was created); `live`: it must get every acknowledged message (False: only its order is checked)."""

    topic: str
    name: str
    type: SubType
    first_offset: int = 0
    live: bool = True


@dataclass(frozen=True, slots=True)
class Delivery:
    topic: str
    subscription: str
    consumer: str
    offset: int
    payload: bytes
    message_id: str
    time: float
    key: str | None = None  # None: taken from the message's Publish


@dataclass(frozen=True, slots=True)
class ConsumerAck:
    topic: str
    subscription: str
    consumer: str
    offset: int
    time: float


@dataclass(frozen=True, slots=True)
class CursorObserved:
    """The subscription's cursor seen at `time`: `next_offset` is the first offset not yet consumed."""

    topic: str
    subscription: str
    next_offset: int
    time: float


@dataclass(frozen=True, slots=True)
class CursorReset:
    """An explicit move of the cursor (a seek): the only way it may go back."""

    topic: str
    subscription: str
    next_offset: int
    time: float


@dataclass
class History:
    """Events in the order they were recorded; `reads` is the final read-back (topic -> offset -> payload),
    `start_offsets` each topic's start offset (moved by retention) when it was read back."""

    publishes: list[Publish] = field(default_factory=list)
    acks: list[Acked] = field(default_factory=list)
    subscriptions: list[Subscription] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)
    consumer_acks: list[ConsumerAck] = field(default_factory=list)
    cursors: list[CursorObserved | CursorReset] = field(default_factory=list)
    reads: dict[str, dict[int, bytes]] = field(default_factory=dict)
    start_offsets: dict[str, int] = field(default_factory=dict)


@dataclass
class CheckResult:
    acknowledged: int = 0
    lost: int = 0
    conflicts: int = 0
    duplicates_stored: int = 0
    duplicate_deliveries: int = 0
    skipped_by_retention: int = 0
    undelivered: dict[str, int] = field(default_factory=dict)  # "topic subscription" -> count
    order_violations: int = 0
    cursor_regressions: int = 0
    cursor_ahead: int = 0
    examples: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """No anomaly that breaks a promise (duplicates are allowed by at-least-once delivery)."""
        bad = self.lost + self.conflicts + self.order_violations + self.cursor_regressions + self.cursor_ahead
        return bad == 0 and not any(self.undelivered.values())

    def note(self, kind: str, text: str) -> None:
        kept = self.examples.setdefault(kind, [])
        if len(kept) < EXAMPLES:
            kept.append(text)

    def summary(self) -> str:
        undelivered = sum(self.undelivered.values())
        lines = [
            f"{'OK' if self.ok else 'ANOMALIES'}: {self.acknowledged} acknowledged, {self.lost} lost, "
            f"{self.conflicts} conflicts, {self.duplicates_stored} stored twice, "
            f"{self.duplicate_deliveries} redelivered, {undelivered} undelivered, "
            f"{self.skipped_by_retention} skipped by retention, {self.order_violations} out of order, "
            f"{self.cursor_regressions} cursor regressions, {self.cursor_ahead} cursor ahead of acks"
        ]
        lines += [f"  undelivered on {sub}: {n}" for sub, n in sorted(self.undelivered.items()) if n]
        for kind, texts in sorted(self.examples.items()):
            lines += [f"  {kind}: {t}" for t in texts]
        return "\n".join(lines)


def _sub_label(topic: str, name: str) -> str:
    return f"{topic} {name}"


class _Bindings:
    """offset -> payload as first seen anywhere; a second payload for an offset is a conflict."""

    def __init__(self, result: CheckResult) -> None:
        self.result = result
        self.seen: dict[tuple[str, int], tuple[bytes, str]] = {}
        self.conflicting: set[tuple[str, int]] = set()

    def bind(self, topic: str, offset: int, payload: bytes, source: str) -> None:
        first = self.seen.setdefault((topic, offset), (payload, source))
        if first[0] != payload and (topic, offset) not in self.conflicting:
            self.conflicting.add((topic, offset))
            self.result.conflicts += 1
            self.result.note(
                "conflict", f"{topic}@{offset}: {first[0]!r} ({first[1]}) and {payload!r} ({source})"
            )


def check(history: History) -> CheckResult:
    result = CheckResult()
    bindings = _Bindings(result)
    for a in history.acks:
        bindings.bind(a.topic, a.offset, a.payload, "acknowledged")
    for topic, stored in history.reads.items():
        for offset, payload in stored.items():
            bindings.bind(topic, offset, payload, "read back")
    for d in history.deliveries:
        bindings.bind(d.topic, d.offset, d.payload, f"delivered to {d.subscription}/{d.consumer}")
    acked = _check_storage(history, result)
    _check_deliveries(history, acked, result)
    _check_order(history, result)
    _check_cursors(history, result)
    return result


def _check_storage(history: History, result: CheckResult) -> dict[str, dict[int, bytes]]:
    """Lost and duplicated acknowledged messages; returns topic -> acknowledged offset -> payload."""
    ack_offsets: dict[tuple[str, bytes], set[int]] = defaultdict(set)
    for a in history.acks:
        ack_offsets[(a.topic, a.payload)].add(a.offset)
    stored_at: dict[tuple[str, bytes], set[int]] = defaultdict(set)
    for topic, stored in history.reads.items():
        for offset, payload in stored.items():
            stored_at[(topic, payload)].add(offset)
    acked: dict[str, dict[int, bytes]] = defaultdict(dict)
    result.acknowledged = len(ack_offsets)
    for (topic, payload), offsets in ack_offsets.items():
        start = history.start_offsets.get(topic, 0)
        stored = history.reads.get(topic, {})
        everywhere = offsets | stored_at.get((topic, payload), set())
        if len(everywhere) > 1:
            result.duplicates_stored += 1
            result.note("duplicate stored", f"{topic} {payload!r} at offsets {sorted(everywhere)[:6]}")
        for offset in sorted(offsets):
            acked[topic][offset] = payload
            if offset < start:
                continue  # retention moved the start past it: counted per subscription below
            if offset not in stored:
                result.lost += 1
                result.note("lost", f"{topic}@{offset}: {payload!r} acknowledged, not read back")
            # another payload at that offset is already a conflict (bindings)
    return acked


def _check_deliveries(history: History, acked: dict[str, dict[int, bytes]], result: CheckResult) -> None:
    delivered: dict[tuple[str, str], dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for d in history.deliveries:
        delivered[(d.topic, d.subscription)][d.offset] += 1
    for counts in delivered.values():
        result.duplicate_deliveries += sum(n - 1 for n in counts.values())
    for sub in history.subscriptions:
        if not sub.live:
            continue
        label = _sub_label(sub.topic, sub.name)
        got = delivered.get((sub.topic, sub.name), {})
        start = history.start_offsets.get(sub.topic, 0)
        missing = 0
        for offset in sorted(acked.get(sub.topic, {})):
            if offset < sub.first_offset or offset in got:
                continue
            if offset < start:
                result.skipped_by_retention += 1
                continue
            missing += 1
            result.note("undelivered", f"{label}: offset {offset} ({acked[sub.topic][offset]!r})")
        result.undelivered[label] = missing


def _check_order(history: History, result: CheckResult) -> None:
    """First deliveries of an ordered scope come in offset order; redeliveries may repeat earlier ones."""
    types = {(s.topic, s.name): s.type for s in history.subscriptions}
    key_of = {(p.topic, p.payload): p.key for p in history.publishes}
    seen: set[tuple[str, str, int]] = set()
    highest: dict[tuple[str, str, str | None], tuple[int, str]] = {}
    for d in history.deliveries:
        kind = types.get((d.topic, d.subscription))
        if (d.topic, d.subscription, d.offset) in seen:
            continue
        seen.add((d.topic, d.subscription, d.offset))
        scope: tuple[str, str, str | None]
        if kind in ORDERED_BY_TOPIC:
            scope = (d.topic, d.subscription, None)
        elif kind in ORDERED_BY_KEY:
            key = d.key if d.key is not None else key_of.get((d.topic, d.payload))
            scope = (d.topic, d.subscription, key)
        else:
            continue
        top = highest.get(scope)
        if top is not None and d.offset < top[0]:
            result.order_violations += 1
            where = f" key {scope[2]!r}" if kind in ORDERED_BY_KEY else ""
            result.note(
                "out of order",
                f"{_sub_label(d.topic, d.subscription)}{where}: offset {d.offset} first delivered to "
                f"{d.consumer} after offset {top[0]} (to {top[1]})",
            )
        else:
            highest[scope] = (d.offset, d.consumer)


def _check_cursors(history: History, result: CheckResult) -> None:
    # Offsets that exist (acknowledged or read back): the only ones a cursor must not pass unacknowledged.
    exists: dict[str, set[int]] = defaultdict(set)
    for a in history.acks:
        exists[a.topic].add(a.offset)
    for topic, stored in history.reads.items():
        exists[topic].update(stored)
    known = {topic: sorted(offsets) for topic, offsets in exists.items()}
    first_ack: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    for ca in history.consumer_acks:
        first_ack[(ca.topic, ca.subscription)].setdefault(ca.offset, ca.time)
    subs = {(s.topic, s.name): s for s in history.subscriptions}
    last: dict[tuple[str, str], int] = {}
    checked: dict[tuple[str, str], int] = {}
    for event in history.cursors:
        scope = (event.topic, event.subscription)
        label = _sub_label(*scope)
        if isinstance(event, CursorReset):
            last[scope] = event.next_offset
            continue
        before = last.get(scope)
        if before is not None and event.next_offset < before:
            result.cursor_regressions += 1
            result.note(
                "cursor regression", f"{label}: {before} then {event.next_offset} at t={event.time:.3f}"
            )
        last[scope] = event.next_offset
        sub = subs.get(scope)
        floor = max(
            sub.first_offset if sub is not None else 0,
            history.start_offsets.get(event.topic, 0),
            checked.get(scope, 0),
        )
        offsets = known.get(event.topic, [])
        acks = first_ack.get(scope, {})
        lo = bisect.bisect_left(offsets, floor)
        hi = bisect.bisect_left(offsets, event.next_offset)
        for offset in offsets[lo:hi]:
            when = acks.get(offset)
            if when is None or when > event.time:
                result.cursor_ahead += 1
                result.note(
                    "cursor ahead",
                    f"{label}: cursor at {event.next_offset} at t={event.time:.3f}, offset {offset} "
                    f"{'never acknowledged' if when is None else f'acknowledged at t={when:.3f}'}",
                )
        checked[scope] = max(floor, event.next_offset)
