"""Typed values of the metadata keys the broker reads back (docs/metadata.md lists the keys).

Each record is parsed once where it is read: `parse` returns None for a value that is not a valid record
(written by another tool or an older version), and callers decide what that means. Field names are the
stored JSON names.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from ister.core.compression import NAMES

R = TypeVar("R", bound="Record")


class Record(msgspec.Struct, kw_only=True, frozen=True):
    @classmethod
    def parse(cls: type[R], value: Any) -> R | None:
        if not isinstance(value, dict):
            return None
        try:
            return msgspec.convert(value, cls, strict=True)
        except msgspec.ValidationError:
            return None

    def to_json(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)  # type: ignore[no-any-return]


class SealedState(Record, frozen=True):
    """`/storage/topics/{ns}/{topic}/state`: where the last owner stopped appending when it sealed."""

    sealed: bool
    last_committed_offset: int
    broker_id: int = 0
    timestamp: int = 0
    epoch: int | None = None  # the sealing owner's epoch (None: standalone or older versions)

    @property
    def next_offset(self) -> int | None:
        """last_committed_offset + 1, None when this is not a usable sealed state."""
        if not self.sealed or self.last_committed_offset < 0:
            return None
        return self.last_committed_offset + 1


class ProducerRecord(Record, frozen=True):
    """`/topics/{ns}/{topic}/producers/{id}`."""

    producer_id: int
    producer_name: str
    topic_name: str = ""
    access_mode: int = 0
    status: bool = True


class SubscriptionRecord(Record, frozen=True):
    """`/topics/{ns}/{topic}/subscriptions/{name}`; `start_offset` only for reliable topics."""

    subscription_name: str = ""
    subscription_type: int = 0
    consumer_id: int | None = None
    consumer_name: str = ""
    key_filters: list[str] = msgspec.field(default_factory=list)
    start_offset: int | None = None

    def to_json(self) -> dict[str, Any]:
        out = msgspec.to_builtins(self)
        if self.start_offset is None:
            del out["start_offset"]
        return out  # type: ignore[no-any-return]


class ConsumerIndexRecord(Record, frozen=True):
    """`/ister/consumers/{id}`: lets a consumer id survive a broker restart (an Ister addition)."""

    topic: str
    subscription: str
    consumer_name: str
    subscription_type: int
    key_filters: list[str] = msgspec.field(default_factory=list)


class DispatchConfigRecord(Record, frozen=True):
    """`/topics/{ns}/{topic}/subscriptions/{name}/dispatch_config`; an absent field: the broker's default."""

    max_unacked_messages: int | None = None
    rebalance_delay_seconds: float | None = None  # Failover on a partitioned topic
    max_handoff_seconds: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in msgspec.to_builtins(self).items() if v is not None}


QUOTA_POLICIES = ("producer_error", "producer_hold", "consumer_eviction")


class NamespacePolicy(Record, frozen=True):
    """`/namespaces/{ns}/policy`: limits (0 = unlimited); `max_message_size` None: the broker's default."""

    max_producers_per_topic: int = 0
    max_subscriptions_per_topic: int = 0
    max_consumers_per_topic: int = 0
    max_consumers_per_subscription: int = 0
    # Rates (docs/limits.md): per topic (each partition), messages and payload bytes per second; dispatch
    # per reliable subscription, messages per second
    max_publish_rate: int = 0
    max_publish_rate_bytes: int = 0
    max_subscription_dispatch_rate: int = 0
    max_topics_per_namespace: int = 0  # Ister: topics (each partition counts) the namespace may hold
    max_message_size: int | None = None
    # Replicated topics (Ister): None takes the broker's cluster.replication_factor / min_insync_replicas
    replication_factor: int | None = None
    min_insync_replicas: int | None = None
    # Retention (Ister; None: 7 days and unlimited, core.retention): 0 = unlimited
    retention_time_ms: int | None = None
    retention_size_bytes: int | None = None
    # Backlog quota of the slowest subscription (Ister, Pulsar's): None or 0 = none
    backlog_quota_size_bytes: int | None = None
    backlog_quota_time_ms: int | None = None
    backlog_quota_policy: str | None = None  # producer_error (default) | producer_hold | consumer_eviction
    message_ttl_ms: int | None = None  # unacknowledged messages older than this are acknowledged for them
    # Compression (Ister, docs/compression.md): the codec the broker stores records with when the producer
    # sent them plain; None: none. `compression_dictionary` (zstd only): each topic trains its own dictionary
    compression: str | None = None
    compression_dictionary: bool = False

    @classmethod
    def lenient(cls, value: Any) -> NamespacePolicy:
        """Each known limit that is a non-negative integer; anything else (another tool's fields, a bad
        value) is ignored rather than voiding every limit of the namespace."""
        if not isinstance(value, dict):
            return cls()
        fields: dict[str, Any] = {
            name: v
            for name in cls.__struct_fields__
            if isinstance(v := value.get(name), int) and not isinstance(v, bool) and v >= 0
        }
        policy = value.get("backlog_quota_policy")
        if policy in QUOTA_POLICIES:
            fields["backlog_quota_policy"] = policy
        codec = value.get("compression")
        if codec in NAMES.values():
            fields["compression"] = codec
        fields["compression_dictionary"] = value.get("compression_dictionary") is True and codec == "zstd"
        return cls(**fields)


class TopicReplication(Record, frozen=True):
    """`/topics/{ns}/{topic}/replication` (Ister): the topic's own replication setting, given at creation;
    None: the namespace policy's, else the broker's (core.replication_policy)."""

    replication_factor: int | None = None
    min_insync_replicas: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in msgspec.to_builtins(self).items() if v is not None}


class TopicRetention(Record, frozen=True):
    """`/ister/retention/{ns}/{topic}`: a topic's own retention limits; None: its namespace's."""

    retention_time_ms: int | None = None
    retention_size_bytes: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in msgspec.to_builtins(self).items() if v is not None}


class TopicCompression(Record, frozen=True, omit_defaults=True):
    """`/ister/compression/{ns}/{topic}`: a topic's own compression codec (a name of core.compression);
    with zstd, `dictionary`: the owner trains a zstd dictionary on its records and, once it is stored under
    `/ister/compression-dicts/{id}`, records its id here (`dictionary_id`, by compare-and-set)."""

    compression: str
    dictionary: bool = False
    dictionary_id: int | None = None

    @classmethod
    def lenient(cls, value: Any) -> TopicCompression | None:
        if not isinstance(value, dict):
            return None
        codec = value.get("compression")
        if not isinstance(codec, str) or codec not in NAMES.values():
            return None
        wanted = value.get("dictionary") is True and codec == "zstd"
        dict_id = value.get("dictionary_id")
        ok_id = type(dict_id) is int and 0 < dict_id < 2**32
        return cls(compression=codec, dictionary=wanted, dictionary_id=dict_id if wanted and ok_id else None)


def namespace_dict_id(value: Any) -> int | None:
    """The id of `/ister/compression-namespace-dict/{ns}/{topic}` (`{"dictionary_id": N}`); None when the
    value is not such a record."""
    dict_id = value.get("dictionary_id") if isinstance(value, dict) else None
    return dict_id if type(dict_id) is int and 0 < dict_id < 2**32 else None


class TopicRateLimits(Record, frozen=True):
    """`/ister/rate-limits/{ns}/{topic}`: a topic's own rate limits (0 = unlimited); None: its namespace's."""

    max_publish_rate: int | None = None
    max_publish_rate_bytes: int | None = None
    max_subscription_dispatch_rate: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in msgspec.to_builtins(self).items() if v is not None}


def parse_start(kv: object) -> int:
    """A topic's start offset from its `/ister/start-offsets/{ns}/{topic}` entry (0: none yet)."""
    value = getattr(kv, "value", None)
    start = value.get("start_offset") if isinstance(value, dict) else None
    return start if isinstance(start, int) and not isinstance(start, bool) and start >= 0 else 0


class BrokerRegistration(Record, frozen=True):
    """`/cluster/register/{id}` (Danube v0.15 names and the older layout's, docs/metadata.md)."""

    broker_url: str = ""
    connect_url: str = ""
    admin_addr: str = ""
    broker_addr: str = ""
    prom_exporter: str = ""
    zone: str = ""  # Ister: where the broker runs, for replica placement

    @property
    def url(self) -> str:
        return self.connect_url or self.broker_url or self.broker_addr
