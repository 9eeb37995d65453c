"""Offset arithmetic of the Spark connector, pure so it is tested without Spark or a broker.

Positions are `{base topic: {partition: next offset}}` with string partition keys ("-1" for a topic that
is not partitioned), the JSON shape Spark keeps in its offset log. Ranges are half-open: [start, end).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, TypeAlias

from ister.errors import InvalidArgument
from ister.ids import TopicName

EARLIEST = -2  # in a startingOffsets JSON, as Kafka
LATEST = -1
NOT_PARTITIONED = -1

Positions: TypeAlias = dict[str, dict[str, int]]
Spec: TypeAlias = Literal["earliest", "latest"] | Positions


@dataclass(frozen=True, slots=True, order=True)
class TopicPartition:
    """One readable stream: `topic` is the base topic, `partition` its index or -1."""

    topic: str
    partition: int

    @property
    def name(self) -> str:
        """The concrete topic the broker serves (`/ns/t-part-N` for a partition)."""
        if self.partition == NOT_PARTITIONED:
            return self.topic
        return TopicName.parse(self.topic).partition_topic(self.partition).full

    @classmethod
    def of(cls, concrete: str) -> TopicPartition:
        name = TopicName.parse(concrete)
        part = name.partition
        if part is None:
            return cls(name.full, NOT_PARTITIONED)
        return cls(f"/{name.namespace}/{part[0]}", part[1])


def parse_spec(raw: str | None, option: str, *, default: str, allow_earliest: bool = True) -> Spec:
    """`earliest`, `latest` or JSON `{"/ns/t": {"0": 23, "-1": -2}}` (-2 earliest, -1 latest)."""
    text = (raw if raw is not None else default).strip()
    if text.lower() in ("earliest", "latest"):
        if text.lower() == "earliest" and not allow_earliest:
            raise InvalidArgument(f"{option}: 'earliest' is not allowed here")
        return "earliest" if text.lower() == "earliest" else "latest"
    try:
        value = json.loads(text)
    except ValueError:
        raise InvalidArgument(f"{option}: expected earliest, latest or a JSON object, got {text!r}") from None
    if not isinstance(value, dict):
        raise InvalidArgument(f"{option}: expected a JSON object of topic -> {{partition: offset}}")
    out: Positions = {}
    for topic, parts in value.items():
        full = TopicName.parse(topic).full
        if not isinstance(parts, dict) or not parts:
            raise InvalidArgument(f"{option}: {topic!r} needs a non-empty object of partition -> offset")
        out[full] = {}
        for part, offset in parts.items():
            if not (isinstance(part, str) and part.lstrip("-").isdigit() and int(part) >= NOT_PARTITIONED):
                raise InvalidArgument(f"{option}: bad partition {part!r} for {topic!r}")
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < EARLIEST:
                raise InvalidArgument(f"{option}: bad offset {offset!r} for {topic!r} partition {part}")
            if offset == EARLIEST and not allow_earliest:
                raise InvalidArgument(f"{option}: -2 (earliest) is not allowed here")
            out[full][str(int(part))] = offset
    return out


def resolve(
    spec: Spec, tp: TopicPartition, earliest: int, latest: int, *, missing: Literal["earliest", "latest"]
) -> int:
    """The concrete offset a spec gives one partition; `missing` applies to partitions a JSON spec omits."""
    if spec == "earliest":
        return earliest
    if spec == "latest":
        return latest
    given = spec.get(tp.topic, {}).get(str(tp.partition))
    if given is None or given in (EARLIEST, LATEST):
        choice = missing if given is None else ("earliest" if given == EARLIEST else "latest")
        return earliest if choice == "earliest" else latest
    return given


def get(positions: Mapping[str, Mapping[str, int]], tp: TopicPartition) -> int | None:
    return positions.get(tp.topic, {}).get(str(tp.partition))


def put(positions: Positions, tp: TopicPartition, offset: int) -> None:
    positions.setdefault(tp.topic, {})[str(tp.partition)] = offset


def cap(
    start: Mapping[TopicPartition, int], end: Mapping[TopicPartition, int], max_rows: int
) -> dict[TopicPartition, int]:
    """Ends that take at most `max_rows` offsets in all, split in proportion to each partition's backlog
    (as Kafka's maxOffsetsPerTrigger). Every partition with a backlog advances by at least one when
    `max_rows` allows it, so none starves."""
    if max_rows < 1:
        raise InvalidArgument("maxOffsetsPerTrigger must be at least 1")
    backlog = {tp: max(0, end[tp] - start.get(tp, end[tp])) for tp in end}
    total = sum(backlog.values())
    if total <= max_rows:
        return dict(end)
    share = {tp: (b * max_rows) // total for tp, b in backlog.items()}
    left = max_rows - sum(share.values())
    # Hand out what rounding left over: first to partitions that got nothing, then by largest remainder.
    order = sorted(backlog, key=lambda tp: (share[tp] > 0, -((backlog[tp] * max_rows) % total), tp))
    for tp in order:
        if left == 0:
            break
        if backlog[tp] > share[tp]:
            share[tp] += 1
            left -= 1
    return {tp: start.get(tp, end[tp]) + share[tp] for tp in end}


def split(start: int, end: int, pieces: int) -> list[tuple[int, int]]:
    """[start, end) cut into `pieces` near-equal, non-empty, contiguous ranges."""
    if end <= start:
        return []
    pieces = max(1, min(pieces, end - start))
    size, extra = divmod(end - start, pieces)
    out, at = [], start
    for i in range(pieces):
        step = size + (1 if i < extra else 0)
        out.append((at, at + step))
        at += step
    return out


def plan_ranges(
    ranges: Mapping[TopicPartition, tuple[int, int]],
    min_partitions: int | None,
    max_offsets_per_partition: int | None = None,
) -> list[tuple[TopicPartition, int, int]]:
    """Input partitions: one per topic partition with data, more when `minPartitions` asks for it (large
    ranges cut in proportion to their size, as Kafka's offset range calculator) and whenever a range
    holds more than `max_offsets_per_partition` offsets (so one big partition still uses every core)."""
    todo = {tp: r for tp, r in sorted(ranges.items()) if r[1] > r[0]}
    if not todo:
        return []
    total = sum(e - s for s, e in todo.values())
    out: list[tuple[TopicPartition, int, int]] = []
    for tp, (s, e) in todo.items():
        pieces = 1
        if min_partitions is not None and min_partitions > len(todo):
            pieces = max(1, round((e - s) * min_partitions / total))
        if max_offsets_per_partition is not None:
            pieces = max(pieces, -(-(e - s) // max_offsets_per_partition))
        out.extend((tp, a, b) for a, b in split(s, e, pieces))
    return out
