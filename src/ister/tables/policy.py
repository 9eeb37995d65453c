"""Table policies (docs/tables.md, "Policy"): whether a topic is also an Iceberg table, how the table is
partitioned and how often its tail is committed.

A namespace's policy lives in its `/namespaces/{ns}/policy` (fields `table_format`, `table_partition`,
`table_interval_ms`), a topic's own in `/ister/tables/{ns}/{topic}` (`format`, `partition`,
`interval_ms`). Each field of a topic's own policy overrides its namespace's; off by default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ister.core.retention import format_duration_ms, parse_duration_ms
from ister.errors import InvalidArgument
from ister.ids import shown

FORMATS = ("iceberg", "none")
PARTITIONS = ("day", "hour")
DEFAULT_INTERVAL_MS = 10_000
MIN_INTERVAL_MS = 1_000
MAX_INTERVAL_MS = 86_400_000
_RANGE = f"between {format_duration_ms(MIN_INTERVAL_MS)} and {format_duration_ms(MAX_INTERVAL_MS)}, e.g. 10s"
NAMESPACE_FIELDS = {
    "format": "table_format",
    "partition": "table_partition",
    "interval_ms": "table_interval_ms",
}


@dataclass(frozen=True, slots=True)
class TableSetting:
    """What a namespace or topic sets; None: not set here (the next level's applies)."""

    format: str | None = None
    partition: str | None = None
    interval_ms: int | None = None

    @property
    def empty(self) -> bool:
        return self.format is None and self.partition is None and self.interval_ms is None

    def merged(self, new: TableSetting) -> TableSetting:
        """This setting with every field `new` gives replaced."""
        return TableSetting(
            new.format if new.format is not None else self.format,
            new.partition if new.partition is not None else self.partition,
            new.interval_ms if new.interval_ms is not None else self.interval_ms,
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.format is not None:
            out["format"] = self.format
        if self.partition is not None:
            out["partition"] = self.partition
        if self.interval_ms is not None:
            out["interval_ms"] = self.interval_ms
        return out

    @classmethod
    def from_json(cls, value: Any) -> TableSetting:
        """A stored setting; fields that are not valid are ignored (another tool's, a bad write)."""
        if not isinstance(value, dict):
            return cls()
        fmt, part, interval = value.get("format"), value.get("partition"), value.get("interval_ms")
        return cls(
            fmt if fmt in FORMATS else None,
            part if part in PARTITIONS else None,
            interval if _valid_interval(interval) else None,
        )

    @classmethod
    def of_namespace(cls, policy: Any) -> TableSetting:
        """The setting held in a namespace's policy document."""
        if not isinstance(policy, dict):
            return cls()
        return cls.from_json({ours: policy.get(theirs) for ours, theirs in NAMESPACE_FIELDS.items()})


def _valid_interval(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and MIN_INTERVAL_MS <= v <= MAX_INTERVAL_MS


def parse_setting(fmt: str | None, partition: str | None, interval: str | None) -> TableSetting:
    """A setting from the CLI's text (InvalidArgument with what is wrong)."""
    interval_ms = None
    if interval is not None:
        try:
            interval_ms = parse_duration_ms(interval)
        except InvalidArgument:
            # The generic duration message offers `0` (unlimited), which an interval cannot be.
            raise InvalidArgument(f"invalid table commit interval {shown(interval)}: {_RANGE}") from None
        if interval_ms <= 0:
            raise InvalidArgument(f"table commit interval {shown(interval)} is out of range: {_RANGE}")
    return checked(fmt, partition, interval_ms)


def checked(fmt: str | None, partition: str | None, interval_ms: int | None) -> TableSetting:
    """A setting whose every given field is valid (InvalidArgument naming the first that is not)."""
    if fmt is not None and fmt not in FORMATS:
        raise InvalidArgument(f"unknown table format {shown(fmt)}: expected iceberg or none")
    if partition is not None and partition not in PARTITIONS:
        raise InvalidArgument(f"unknown table partitioning {shown(partition)}: expected day or hour")
    if interval_ms is not None and not _valid_interval(interval_ms):
        raise InvalidArgument(
            # 0 ms is not "unlimited" here (format_duration_ms's reading of a retention limit).
            f"table commit interval {format_duration_ms(interval_ms) if interval_ms else '0s'} is out of "
            f"range: {_RANGE}"
        )
    return TableSetting(fmt, partition, interval_ms)


@dataclass(frozen=True, slots=True)
class TablePolicy:
    """The policy in effect for one topic, and where each field comes from."""

    format: str = "none"
    partition: str = "day"
    interval_ms: int = DEFAULT_INTERVAL_MS
    format_source: str = "default"  # "topic", "namespace" or "default"
    partition_source: str = "default"
    interval_source: str = "default"

    @property
    def on(self) -> bool:
        return self.format == "iceberg"


def in_effect(own: TableSetting | None, namespace: TableSetting) -> TablePolicy:
    own = own or TableSetting()
    fmt, fmt_src = _pick(own.format, namespace.format, "none")
    part, part_src = _pick(own.partition, namespace.partition, "day")
    interval, interval_src = _pick(own.interval_ms, namespace.interval_ms, DEFAULT_INTERVAL_MS)
    assert isinstance(interval, int)
    return TablePolicy(str(fmt), str(part), interval, fmt_src, part_src, interval_src)


def _pick(topic: object, namespace: object, default: object) -> tuple[object, str]:
    if topic is not None:
        return topic, "topic"
    if namespace is not None:
        return namespace, "namespace"
    return default, "default"


__all__ = [
    "DEFAULT_INTERVAL_MS",
    "FORMATS",
    "NAMESPACE_FIELDS",
    "PARTITIONS",
    "TablePolicy",
    "TableSetting",
    "checked",
    "in_effect",
    "parse_setting",
]
