"""Offset JSON typed by a user (`startingOffsets`, `endingOffsets`) checked against the partitions a query
really has, once they are known on the driver: a key that matches nothing is an error (as in Kafka's
source), never silently read from the default position."""

from __future__ import annotations

from collections.abc import Iterable

from ister.core.stream_offsets import NOT_PARTITIONED, Positions, Spec, TopicPartition
from ister.errors import InvalidArgument


def _listing(have: dict[str, list[int]]) -> str:
    if not have:
        return "the query has no topic partitions"
    parts = []
    for topic, indexes in sorted(have.items()):
        text = "-1 (or 0)" if indexes == [NOT_PARTITIONED] else ", ".join(map(str, indexes))
        parts.append(f"{topic}: {text}")
    return "the query has " + "; ".join(parts)


def check_spec(spec: Spec, option: str, tps: Iterable[TopicPartition]) -> Spec:
    """`spec` with its keys checked against `tps`. A topic without partitions is keyed "-1", and "0" is
    taken for it too (what a Kafka user types: a Kafka topic has at least partition 0)."""
    if isinstance(spec, str):
        return spec
    have: dict[str, list[int]] = {}
    for tp in sorted(tps):
        have.setdefault(tp.topic, []).append(tp.partition)
    out: Positions = {}
    for topic, parts in spec.items():
        indexes = have.get(topic)
        if indexes is None:
            raise InvalidArgument(f"{option}: {topic} is not read by this query; {_listing(have)}")
        for key, offset in parts.items():
            part = int(key)
            if indexes == [NOT_PARTITIONED] and part == 0:
                part = NOT_PARTITIONED
            if part not in indexes:
                raise InvalidArgument(f"{option}: {topic} has no partition {key}; {_listing(have)}")
            mine = out.setdefault(topic, {})
            if str(part) in mine and mine[str(part)] != offset:
                raise InvalidArgument(f"{option}: {topic} is given twice (-1 and 0), with different offsets")
            mine[str(part)] = offset
    return out
