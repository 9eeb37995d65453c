"""The admin API's values and input checks, apart from its operations (broker/admin_ops.py): what a
listing or a description returns, and the checks of a request's arguments made before anything is read."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from ister.core.dispatch import FailurePolicy
from ister.core.replication import ReplicaRecord
from ister.core.replication_policy import ReplicationSetting
from ister.errors import InvalidArgument
from ister.ids import TopicName, shown
from ister.limits import MAX_NAME_LEN, MAX_WINDOW, MIN_WINDOW
from ister.metadata import keys
from ister.metadata.records import TopicReplication
from ister.schema.records import VersionView

MAX_PARTITIONS = 1_000
DLQ_SUFFIX_LEN = len("-DLQ")


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    broker_id: int | None  # None: waiting for an owner (cluster mode)
    delivery: str


@dataclass(frozen=True, slots=True)
class TopicDescription:
    name: str
    broker_id: int | None
    delivery: str
    subscriptions: list[str]
    partitions: list[str] = field(default_factory=list)  # a partitioned topic's `-part-N` topics
    schema_subject: str | None = None
    replication: ReplicaRecord | None = None  # a replicated topic's replica record
    replica_lag: dict[int, int] | None = None  # follower -> records it lacks (asked broker leads it)
    attached: list[tuple[str, str]] = field(default_factory=list)  # (subscription, consumer) streaming here
    replication_state: str | None = None  # core.replication.replication_state, for a replicated topic
    schema: VersionView | None = None  # the subject's latest version (id, type, compatibility mode)


@dataclass(frozen=True, slots=True)
class SubscriptionPolicy:
    failure_policy: FailurePolicy | None
    subscription_type: int


def parse_broker_id(raw: str) -> int:
    text = raw.strip()
    if not text.isascii() or not text.isdigit() or (len(text) > 1 and text[0] == "0"):
        raise InvalidArgument(f"invalid broker id {shown(raw)}: expected a decimal unsigned 64-bit integer")
    value = int(text)
    if value > keys.U64_MAX:
        raise InvalidArgument(f"invalid broker id {shown(raw)}: larger than an unsigned 64-bit integer")
    return value


def check_dispatch_settings(
    max_unacked: int | None, rebalance_delay: float | None, max_handoff: float | None
) -> None:
    if max_unacked is None and rebalance_delay is None and max_handoff is None:
        raise InvalidArgument(
            "nothing to set: give max_unacked_messages, rebalance_delay_seconds or max_handoff_seconds"
        )
    if max_unacked is not None and not MIN_WINDOW <= max_unacked <= MAX_WINDOW:
        raise InvalidArgument(
            f"max_unacked_messages must be in {MIN_WINDOW}..{MAX_WINDOW}, got {max_unacked}"
        )
    for what, value in (("rebalance_delay_seconds", rebalance_delay), ("max_handoff_seconds", max_handoff)):
        if value is not None and not (math.isfinite(value) and 0 <= value <= 3_600):
            raise InvalidArgument(f"{what} must be in 0..3600, got {value}")


def creation_targets(name: TopicName, partitions: int | None) -> list[TopicName]:
    """The topics an admin creation of `name` makes (its partitions, if any), checked as names."""
    if name.partition is not None:
        raise InvalidArgument(
            f"{name} is a partition name; create the partitioned topic {name.namespace}/"
            f"{name.partition[0]} with partitions instead"
        )
    if partitions is not None and not 1 <= partitions <= MAX_PARTITIONS:
        raise InvalidArgument(f"partitions must be in 1..{MAX_PARTITIONS}, got {partitions}")
    targets = [name] if partitions is None else [name.partition_topic(i) for i in range(partitions)]
    for t in targets:
        if len(t.topic) + DLQ_SUFFIX_LEN > MAX_NAME_LEN:
            # Leave room for the dead-letter topic `<topic>-DLQ`, as the broker's own creation does.
            raise InvalidArgument(
                f"topic name {t.topic!r} is too long: at most {MAX_NAME_LEN - DLQ_SUFFIX_LEN} characters"
            )
    return targets


def replication_record(setting: ReplicationSetting | None) -> TopicReplication | None:
    if setting is None or (setting.replication_factor is None and setting.min_insync_replicas is None):
        return None
    return TopicReplication(
        replication_factor=setting.replication_factor, min_insync_replicas=setting.min_insync_replicas
    )


def policies_json(policies: dict[str, Any]) -> str:
    return json.dumps(policies, sort_keys=True)
