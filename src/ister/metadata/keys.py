"""The metadata key layout (Danube's, docs/metadata.md "Keys"), as pure functions, plus parsers for listings.

Every builder validates what it is given (topic names through `TopicName`, client-chosen names through
`validate_client_name`, ids as u64), so a key can never gain or lose a `/` segment because of user input.
Parsers take the keys of a prefix listing and keep only the keys that have exactly the expected shape.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeAlias

from ister.errors import InvalidArgument
from ister.ids import TopicName, shown, validate_client_name, validate_segment

U64_MAX = 2**64 - 1
OFFSET_DIGITS = 20

CLUSTER_PREFIX = "/cluster/"
REGISTER_PREFIX = "/cluster/register/"
BROKERS_PREFIX = "/cluster/brokers/"
UNASSIGNED_PREFIX = "/cluster/unassigned/"
LOAD_PREFIX = "/cluster/load/"
LEADER = "/cluster/leader"
REBALANCING_HISTORY_PREFIX = "/cluster/rebalancing_history/"
NAMESPACES_PREFIX = "/namespaces/"
TOPICS_PREFIX = "/topics/"
SCHEMAS_PREFIX = "/schemas/"
SCHEMA_INDEX_BY_ID_PREFIX = "/schemas/_index/by_id/"
SCHEMA_NEXT_ID = "/schemas/_global/next_schema_id"
STORAGE_TOPICS_PREFIX = "/danube-data/storage/topics/"
# Ister additions (docs/metadata.md): ownership records with epochs and offset reservations.
OWNERS_PREFIX = "/ister/owners/"
# Why the last move of a topic failed (the owner could not seal it): the load manager backs off from it.
MOVE_FAILURES_PREFIX = "/ister/move-failures/"
# Index of consumer ids so a consumer survives a broker restart (an Ister addition, see docs/metadata.md).
CONSUMER_INDEX_PREFIX = "/ister/consumers/"
# Cluster mode: one partitioned topic's Failover subscription assigned as one group across its brokers.
PARTITION_GROUPS_PREFIX = "/ister/partition-groups/"
# /ister/replicas/{ns}/{topic}: a replicated topic's replica set, in-sync set, leader and epoch
REPLICAS_PREFIX = "/ister/replicas/"
# /ister/retention/{ns}/{topic}: a topic's own retention limits (absent fields: its namespace's policy)
RETENTION_PREFIX = "/ister/retention/"
# /ister/rate-limits/{ns}/{topic}: a topic's own rate limits (absent fields: its namespace's policy)
RATE_LIMITS_PREFIX = "/ister/rate-limits/"
# /ister/compression/{ns}/{topic}: a topic's own compression (absent: its namespace policy's)
COMPRESSION_PREFIX = "/ister/compression/"
# /ister/compression-dicts/{id}: a trained zstd dictionary, immutable (created if absent; docs/compression.md)
COMPRESSION_DICTS_PREFIX = "/ister/compression-dicts/"
# /ister/compression-namespace-dict/{ns}/{topic}: the dictionary a topic trained under its namespace policy's
# `compression_dictionary` (written once by its owner; used only while that policy asks for one)
NAMESPACE_DICT_PREFIX = "/ister/compression-namespace-dict/"
# /ister/start-offsets/{ns}/{topic}: the lowest offset retention keeps (never moves backwards)
START_OFFSETS_PREFIX = "/ister/start-offsets/"
# /ister/tables/{ns}/{topic}: a topic's own table policy (absent fields: its namespace's; docs/tables.md)
TABLES_PREFIX = "/ister/tables/"
# /ister/absent-brokers/{id}: {"since": wall-clock seconds} when a broker named by replica records was first
# seen unregistered; a lost replica is replaced this long after it, whichever broker leads its topic then.
# The broker deletes its own key when it registers again.
ABSENT_BROKERS_PREFIX = "/ister/absent-brokers/"
PEER_SECRET = "/ister/peer-secret"  # the secret brokers of the cluster prove themselves to each other with

BROKER_STATE = "state"
OBJECTS_CUR = "cur"
_RESERVED_SUBJECTS = frozenset({"_global", "_index"})

TopicLike: TypeAlias = str | TopicName


# --- validation helpers ---------------------------------------------------------------------------


def _topic(topic: TopicLike) -> TopicName:
    return topic if isinstance(topic, TopicName) else TopicName.parse(topic)


def _u64(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= U64_MAX:
        raise InvalidArgument(f"invalid {what} {shown(value)}: expected an unsigned 64-bit integer")
    return value


def _subject(subject: str) -> str:
    validate_client_name(subject, "schema subject")
    if subject in _RESERVED_SUBJECTS:
        raise InvalidArgument(f"invalid schema subject {shown(subject)}: the name is reserved")
    return subject


def _parse_u64(text: str) -> int | None:
    if not text.isdigit() or not text.isascii() or (len(text) > 1 and text[0] == "0"):
        return None
    value = int(text)
    return value if value <= U64_MAX else None


def _parse_topic(ns: str, topic: str) -> str | None:
    try:
        return TopicName.parse(f"/{ns}/{topic}").full
    except InvalidArgument:
        return None


def _children(keys: Iterable[str], prefix: str) -> Iterable[list[str]]:
    """For each key under `prefix`, its remaining segments (the prefix must end with '/')."""
    for key in keys:
        if key.startswith(prefix) and len(key) > len(prefix):
            yield key[len(prefix) :].split("/")


# --- cluster --------------------------------------------------------------------------------------


def cluster_name(name: str) -> str:
    return f"{CLUSTER_PREFIX}{validate_segment(name, 'cluster name')}"


def broker_register(broker_id: int) -> str:
    return f"{REGISTER_PREFIX}{_u64(broker_id, 'broker id')}"


def broker_prefix(broker_id: int) -> str:
    """`/cluster/brokers/{id}/`: the broker's state key and its topic assignments."""
    return f"{BROKERS_PREFIX}{_u64(broker_id, 'broker id')}/"


def broker_state(broker_id: int) -> str:
    return f"{broker_prefix(broker_id)}{BROKER_STATE}"


def broker_topic(broker_id: int, topic: TopicLike) -> str:
    return f"{broker_prefix(broker_id)}{_topic(topic).path}"


def broker_topics_prefix(broker_id: int) -> str:
    """Prefix of the broker's assignments; it also holds the `state` key (skip it with `broker_topics`)."""
    return broker_prefix(broker_id)


def unassigned(topic: TopicLike) -> str:
    return f"{UNASSIGNED_PREFIX}{_topic(topic).path}"


def unassigned_prefix() -> str:
    return UNASSIGNED_PREFIX


def owner(topic: TopicLike) -> str:
    return f"{OWNERS_PREFIX}{_topic(topic).path}"


def absent_broker(broker_id: int) -> str:
    return f"{ABSENT_BROKERS_PREFIX}{broker_id}"


def replicas(topic: TopicLike) -> str:
    return f"{REPLICAS_PREFIX}{_topic(topic).path}"


def topic_retention(topic: TopicLike) -> str:
    return f"{RETENTION_PREFIX}{_topic(topic).path}"


def topic_rate_limits(topic: TopicLike) -> str:
    return f"{RATE_LIMITS_PREFIX}{_topic(topic).path}"


def topic_compression(topic: TopicLike) -> str:
    return f"{COMPRESSION_PREFIX}{_topic(topic).path}"


def compression_dict(dict_id: int) -> str:
    return f"{COMPRESSION_DICTS_PREFIX}{dict_id}"


def topic_namespace_dict(topic: TopicLike) -> str:
    return f"{NAMESPACE_DICT_PREFIX}{_topic(topic).path}"


def namespace_dicts_prefix(ns: str) -> str:
    return f"{NAMESPACE_DICT_PREFIX}{ns}/"


def topic_table(topic: TopicLike) -> str:
    return f"{TABLES_PREFIX}{_topic(topic).path}"


def start_offset(topic: TopicLike) -> str:
    return f"{START_OFFSETS_PREFIX}{_topic(topic).path}"


def replicas_topic(key: str) -> str | None:
    """The topic's full name of a replica record key, None for another key."""
    if not key.startswith(REPLICAS_PREFIX):
        return None
    parts = key[len(REPLICAS_PREFIX) :].split("/")
    return _parse_topic(parts[0], parts[1]) if len(parts) == 2 else None


def consumer_index(consumer_id: int) -> str:
    return f"{CONSUMER_INDEX_PREFIX}{consumer_id}"


def partition_group_prefix(topic: TopicLike, sub: str) -> str:
    """`/ister/partition-groups/{ns}/{topic}/{sub}/` (`topic` the partitioned topic's base name)."""
    return f"{PARTITION_GROUPS_PREFIX}{_topic(topic).path}/{sub}/"


def partition_group_members(topic: TopicLike, sub: str, broker_id: int) -> str:
    """Which consumer names are attached on each partition of the group this broker serves (its lease)."""
    return f"{partition_group_prefix(topic, sub)}members/{_u64(broker_id, 'broker id')}"


def partition_group_assignment(topic: TopicLike, sub: str) -> str:
    """The group's partition -> consumer map, written by the coordinator (the broker serving partition 0)."""
    return f"{partition_group_prefix(topic, sub)}assignment"


def partition_group_from_key(key: str) -> tuple[str, str, str, int | None] | None:
    """(base topic `/ns/t`, subscription, "members" | "assignment", broker id of a members key)."""
    if not key.startswith(PARTITION_GROUPS_PREFIX):
        return None
    parts = key[len(PARTITION_GROUPS_PREFIX) :].split("/")
    topic = _parse_topic(parts[0], parts[1]) if len(parts) >= 4 else None
    if topic is None:
        return None
    if len(parts) == 4 and parts[3] == "assignment":
        return topic, parts[2], "assignment", None
    if len(parts) == 5 and parts[3] == "members" and (broker := _parse_u64(parts[4])) is not None:
        return topic, parts[2], "members", broker
    return None


def move_failure(topic: TopicLike) -> str:
    return f"{MOVE_FAILURES_PREFIX}{_topic(topic).path}"


def move_failure_topic_from_key(key: str) -> str | None:
    if not key.startswith(MOVE_FAILURES_PREFIX):
        return None
    parts = key[len(MOVE_FAILURES_PREFIX) :].split("/")
    return _parse_topic(parts[0], parts[1]) if len(parts) == 2 else None


def load_report(broker_id: int) -> str:
    return f"{LOAD_PREFIX}{_u64(broker_id, 'broker id')}"


def rebalancing_history(ts: int) -> str:
    """`/cluster/rebalancing_history/{unix_secs}`."""
    return f"{REBALANCING_HISTORY_PREFIX}{_u64(ts, 'timestamp')}"


# --- namespaces -----------------------------------------------------------------------------------


def namespace_prefix(ns: str) -> str:
    return f"{NAMESPACES_PREFIX}{validate_segment(ns, 'namespace')}/"


def namespace_policy(ns: str) -> str:
    return f"{namespace_prefix(ns)}policy"


def namespace_topics_prefix(ns: str) -> str:
    return f"{namespace_prefix(ns)}topics/"


def namespace_topic(topic: TopicLike) -> str:
    name = _topic(topic)
    return f"{namespace_topics_prefix(name.namespace)}{name.path}"


# --- topics ---------------------------------------------------------------------------------------


def topic_root(topic: TopicLike) -> str:
    """`/topics/{ns}/{topic}`; its value is the partition count (0 for a plain topic)."""
    return f"/topics{_topic(topic).full}"


def topic_prefix(topic: TopicLike) -> str:
    """`/topics/{ns}/{topic}/`: every child of a topic (not the root key, not `/topics/{ns}/{topic}2`)."""
    return f"{topic_root(topic)}/"


def topic_delivery(topic: TopicLike) -> str:
    return f"{topic_prefix(topic)}delivery"


def topic_policy(topic: TopicLike) -> str:
    return f"{topic_prefix(topic)}policy"


def topic_replication(topic: TopicLike) -> str:
    """The topic's own replication factor and minimum in-sync set (an Ister addition)."""
    return f"{topic_prefix(topic)}replication"


def topic_schema_subject(topic: TopicLike) -> str:
    return f"{topic_prefix(topic)}schema_subject"


def topic_schema_config(topic: TopicLike) -> str:
    return f"{topic_prefix(topic)}schema_config"


def topic_producers_prefix(topic: TopicLike) -> str:
    return f"{topic_prefix(topic)}producers/"


def topic_producer(topic: TopicLike, producer_id: int) -> str:
    return f"{topic_producers_prefix(topic)}{_u64(producer_id, 'producer id')}"


def subscriptions_prefix(topic: TopicLike) -> str:
    return f"{topic_prefix(topic)}subscriptions/"


def subscription(topic: TopicLike, sub: str) -> str:
    return f"{subscriptions_prefix(topic)}{validate_client_name(sub, 'subscription name')}"


def subscription_prefix(topic: TopicLike, sub: str) -> str:
    """`…/subscriptions/{sub}/`: the children of one subscription (cursor, policies)."""
    return f"{subscription(topic, sub)}/"


def subscription_cursor(topic: TopicLike, sub: str) -> str:
    return f"{subscription_prefix(topic, sub)}cursor"


def subscription_failure_policy(topic: TopicLike, sub: str) -> str:
    return f"{subscription_prefix(topic, sub)}failure_policy"


def subscription_dispatch_config(topic: TopicLike, sub: str) -> str:
    return f"{subscription_prefix(topic, sub)}dispatch_config"


# --- durable storage ------------------------------------------------------------------------------


def storage_topic_prefix(topic: TopicLike) -> str:
    return f"{STORAGE_TOPICS_PREFIX}{_topic(topic).path}/"


def storage_objects_prefix(topic: TopicLike) -> str:
    return f"{storage_topic_prefix(topic)}objects/"


def pad_offset(offset: int) -> str:
    return f"{_u64(offset, 'offset'):0{OFFSET_DIGITS}d}"


def storage_object(topic: TopicLike, start: int) -> str:
    return f"{storage_objects_prefix(topic)}{pad_offset(start)}"


def storage_objects_cur(topic: TopicLike) -> str:
    return f"{storage_objects_prefix(topic)}{OBJECTS_CUR}"


def storage_state(topic: TopicLike) -> str:
    return f"{storage_topic_prefix(topic)}state"


# --- schemas --------------------------------------------------------------------------------------


def schema_prefix(subject: str) -> str:
    return f"{SCHEMAS_PREFIX}{_subject(subject)}/"


def schema_metadata(subject: str) -> str:
    return f"{schema_prefix(subject)}metadata"


def schema_versions_prefix(subject: str) -> str:
    return f"{schema_prefix(subject)}versions/"


def schema_version(subject: str, version: int) -> str:
    return f"{schema_versions_prefix(subject)}{_u64(version, 'schema version')}"


def schema_compatibility(subject: str) -> str:
    return f"{schema_prefix(subject)}compatibility"


def schema_by_id(schema_id: int) -> str:
    return f"{SCHEMA_INDEX_BY_ID_PREFIX}{_u64(schema_id, 'schema id')}"


def schema_next_id() -> str:
    return SCHEMA_NEXT_ID


# --- parsers for listings -------------------------------------------------------------------------


def broker_ids(keys: Iterable[str], prefix: str = REGISTER_PREFIX) -> list[int]:
    """Broker ids from keys `{prefix}{id}` (registrations by default; `LOAD_PREFIX` for load reports)."""
    found: set[int] = set()
    for parts in _children(keys, prefix):
        if len(parts) == 1 and (value := _parse_u64(parts[0])) is not None:
            found.add(value)
    return sorted(found)


def broker_topic_from_key(key: str, broker_id: int) -> str | None:
    """The topic `/ns/topic` of an assignment key of this broker, or None (e.g. for the state key)."""
    prefix = broker_prefix(broker_id)
    if not key.startswith(prefix):
        return None
    parts = key[len(prefix) :].split("/")
    return _parse_topic(parts[0], parts[1]) if len(parts) == 2 else None


def broker_topics(keys: Iterable[str], broker_id: int) -> list[str]:
    """Sorted topics assigned to a broker, from a listing of `broker_topics_prefix(broker_id)`."""
    found = {t for key in keys if (t := broker_topic_from_key(key, broker_id)) is not None}
    return sorted(found)


def assignments(keys: Iterable[str]) -> dict[str, int]:
    """topic → broker id, from a listing of `/cluster/brokers/` (exact topic match, state keys skipped)."""
    found: dict[str, int] = {}
    for parts in _children(keys, BROKERS_PREFIX):
        if len(parts) == 3 and (broker := _parse_u64(parts[0])) is not None:
            topic = _parse_topic(parts[1], parts[2])
            if topic is not None:
                found[topic] = broker
    return found


def unassigned_topic_from_key(key: str) -> str | None:
    if not key.startswith(UNASSIGNED_PREFIX):
        return None
    parts = key[len(UNASSIGNED_PREFIX) :].split("/")
    return _parse_topic(parts[0], parts[1]) if len(parts) == 2 else None


def owner_topic_from_key(key: str) -> str | None:
    if not key.startswith(OWNERS_PREFIX):
        return None
    parts = key[len(OWNERS_PREFIX) :].split("/")
    return _parse_topic(parts[0], parts[1]) if len(parts) == 2 else None


def unassigned_topics(keys: Iterable[str]) -> list[str]:
    return sorted({t for key in keys if (t := unassigned_topic_from_key(key)) is not None})


def namespace_names(keys: Iterable[str]) -> list[str]:
    """Sorted unique namespaces from a listing of `/namespaces/` (one entry per namespace, not per key)."""
    found: set[str] = set()
    for parts in _children(keys, NAMESPACES_PREFIX):
        if len(parts) >= 2:
            try:
                found.add(validate_segment(parts[0], "namespace"))
            except InvalidArgument:
                continue
    return sorted(found)


def topics_in_namespace(keys: Iterable[str], ns: str) -> list[str]:
    """Sorted full topic names from a listing of `namespace_topics_prefix(ns)`."""
    found: set[str] = set()
    for parts in _children(keys, namespace_topics_prefix(ns)):
        if len(parts) == 2 and parts[0] == ns and (topic := _parse_topic(parts[0], parts[1])) is not None:
            found.add(topic)
    return sorted(found)


def producer_ids(keys: Iterable[str], topic: TopicLike) -> list[int]:
    found: set[int] = set()
    for parts in _children(keys, topic_producers_prefix(topic)):
        if len(parts) == 1 and (value := _parse_u64(parts[0])) is not None:
            found.add(value)
    return sorted(found)


def subscription_names(keys: Iterable[str], topic: TopicLike) -> list[str]:
    """Sorted names of the subscriptions whose record key (a direct child) is in the listing.

    Children such as `…/{sub}/cursor` do not add a name (nor a duplicate): Danube derives names from every
    descendant and lists a subscription once per child key; Ister does not.
    """
    found: set[str] = set()
    for parts in _children(keys, subscriptions_prefix(topic)):
        if len(parts) == 1:
            found.add(parts[0])
    return sorted(found)


def storage_object_starts(keys: Iterable[str], topic: TopicLike) -> list[int]:
    """Sorted start offsets of the object descriptors in a listing of `storage_objects_prefix(topic)`."""
    found: set[int] = set()
    for parts in _children(keys, storage_objects_prefix(topic)):
        text = parts[0]
        if len(parts) == 1 and len(text) == OFFSET_DIGITS and text.isdigit() and text.isascii():
            value = int(text)
            if value <= U64_MAX:
                found.add(value)
    return sorted(found)


def schema_subjects(keys: Iterable[str]) -> list[str]:
    """Sorted subjects that have a metadata record, from a listing of `/schemas/`."""
    found: set[str] = set()
    for parts in _children(keys, SCHEMAS_PREFIX):
        if len(parts) == 2 and parts[1] == "metadata" and parts[0] not in _RESERVED_SUBJECTS:
            found.add(parts[0])
    return sorted(found)


def schema_versions(keys: Iterable[str], subject: str) -> list[int]:
    found: set[int] = set()
    for parts in _children(keys, schema_versions_prefix(subject)):
        if len(parts) == 1 and (value := _parse_u64(parts[0])) is not None:
            found.add(value)
    return sorted(found)
