"""The seed 003 key layout, key by key, and the listing parsers."""

from __future__ import annotations

import pytest

from ister.errors import InvalidArgument
from ister.ids import TopicName
from ister.metadata import keys as k

T = "/default/reliable_topic"
B = 13308604176970018988


def test_cluster_keys() -> None:
    assert k.cluster_name("MY_CLUSTER") == "/cluster/MY_CLUSTER"
    assert k.broker_register(625722408599041316) == "/cluster/register/625722408599041316"
    assert k.broker_state(B) == f"/cluster/brokers/{B}/state"
    assert k.broker_topic(B, T) == f"/cluster/brokers/{B}/default/reliable_topic"
    assert k.broker_topics_prefix(B) == f"/cluster/brokers/{B}/"
    assert k.unassigned(T) == "/cluster/unassigned/default/reliable_topic"
    assert k.unassigned_prefix() == "/cluster/unassigned/"
    assert k.load_report(B) == f"/cluster/load/{B}"
    assert k.LEADER == "/cluster/leader"
    assert k.rebalancing_history(1768728611) == "/cluster/rebalancing_history/1768728611"


def test_namespace_keys() -> None:
    assert k.namespace_policy("default") == "/namespaces/default/policy"
    assert k.namespace_topics_prefix("default") == "/namespaces/default/topics/"
    assert k.namespace_topic(T) == "/namespaces/default/topics/default/reliable_topic"


def test_topic_keys() -> None:
    assert k.topic_root(T) == "/topics/default/reliable_topic"
    assert k.topic_prefix(T) == "/topics/default/reliable_topic/"
    assert k.topic_delivery(T) == "/topics/default/reliable_topic/delivery"
    assert k.topic_policy(T) == "/topics/default/reliable_topic/policy"
    assert k.topic_schema_subject(T) == "/topics/default/reliable_topic/schema_subject"
    assert k.topic_schema_config(T) == "/topics/default/reliable_topic/schema_config"
    assert (
        k.topic_producer(T, 13940288943180594845)
        == "/topics/default/reliable_topic/producers/13940288943180594845"
    )
    assert k.topic_producers_prefix(T) == "/topics/default/reliable_topic/producers/"
    assert k.subscriptions_prefix(T) == "/topics/default/reliable_topic/subscriptions/"
    sub = "/topics/default/reliable_topic/subscriptions/subs_reliable"
    assert k.subscription(T, "subs_reliable") == sub
    assert k.subscription_cursor(T, "subs_reliable") == f"{sub}/cursor"
    assert k.subscription_failure_policy(T, "subs_reliable") == f"{sub}/failure_policy"
    assert k.subscription_dispatch_config(T, "subs_reliable") == f"{sub}/dispatch_config"


def test_storage_keys() -> None:
    base = "/danube-data/storage/topics/default/reliable_topic"
    assert k.storage_objects_prefix(T) == f"{base}/objects/"
    assert k.storage_object(T, 0) == f"{base}/objects/00000000000000000000"
    assert k.storage_object(T, 30) == f"{base}/objects/00000000000000000030"
    assert k.storage_object(T, 2**64 - 1) == f"{base}/objects/18446744073709551615"
    assert k.storage_objects_cur(T) == f"{base}/objects/cur"
    assert k.storage_state(T) == f"{base}/state"


def test_schema_keys() -> None:
    assert k.schema_metadata("product-catalog") == "/schemas/product-catalog/metadata"
    assert k.schema_version("product-catalog", 2) == "/schemas/product-catalog/versions/2"
    assert k.schema_versions_prefix("product-catalog") == "/schemas/product-catalog/versions/"
    assert k.schema_compatibility("product-catalog") == "/schemas/product-catalog/compatibility"
    assert k.schema_by_id(1) == "/schemas/_index/by_id/1"
    assert k.schema_next_id() == "/schemas/_global/next_schema_id" == k.SCHEMA_NEXT_ID


def test_topic_name_objects_accepted() -> None:
    name = TopicName.parse(T)
    assert k.topic_root(name) == k.topic_root(T)
    assert k.broker_topic(B, name) == k.broker_topic(B, T)
    assert k.topic_root(name.partition_topic(3)) == "/topics/default/reliable_topic-part-3"


@pytest.mark.parametrize(
    "call",
    [
        lambda: k.topic_root("default/t"),
        lambda: k.topic_root("/default/t/x"),
        lambda: k.topic_root("/def ault/t"),
        lambda: k.namespace_policy("a/b"),
        lambda: k.subscription(T, "a/b"),
        lambda: k.subscription(T, ""),
        lambda: k.subscription(T, "bad\nname"),
        lambda: k.broker_register(-1),
        lambda: k.broker_register(2**64),
        lambda: k.topic_producer(T, True),
        lambda: k.storage_object(T, -1),
        lambda: k.schema_metadata("_global"),
        lambda: k.schema_metadata("_index"),
        lambda: k.schema_metadata("a/b"),
        lambda: k.cluster_name("a/b"),
    ],
)
def test_invalid_inputs_rejected(call: object) -> None:
    with pytest.raises(InvalidArgument):
        call()  # type: ignore[operator]


def test_subscription_names_direct_children_only() -> None:
    prefix = k.subscriptions_prefix(T)
    listing = [
        f"{prefix}b",
        f"{prefix}b/cursor",
        f"{prefix}b/failure_policy",
        f"{prefix}a",
        f"{prefix}a/cursor",
        f"{prefix}orphan/cursor",  # no record: not a subscription
        "/topics/default/reliable_topic2/subscriptions/x",
    ]
    assert k.subscription_names(listing, T) == ["a", "b"]


def test_topics_in_namespace() -> None:
    listing = [
        "/namespaces/default/topics/default/t2",
        "/namespaces/default/topics/default/t",
        "/namespaces/default/topics/default/t-part-0",
        "/namespaces/default/topics/other/x",  # wrong namespace segment
        "/namespaces/default/topics/default/t/extra",
        "/namespaces/default/policy",
        "/namespaces/defaultx/topics/defaultx/y",
    ]
    assert k.topics_in_namespace(listing, "default") == ["/default/t", "/default/t-part-0", "/default/t2"]


def test_namespace_names_unique() -> None:
    listing = [
        "/namespaces/default/policy",
        "/namespaces/default/topics/default/t",
        "/namespaces/default/topics/default/u",
        "/namespaces/analytics/policy",
    ]
    assert k.namespace_names(listing) == ["analytics", "default"]


def test_broker_parsers() -> None:
    listing = [
        k.broker_state(B),
        k.broker_topic(B, "/default/t"),
        k.broker_topic(B, "/default/t2"),
        k.broker_topic(B, "/state/x"),  # a namespace called "state" is still a topic
    ]
    assert k.broker_topics(listing, B) == ["/default/t", "/default/t2", "/state/x"]
    assert k.broker_topic_from_key(k.broker_state(B), B) is None
    assert k.broker_topic_from_key(k.broker_topic(B, "/default/t"), B) == "/default/t"
    assert k.broker_topic_from_key(k.broker_topic(1, "/default/t"), 12) is None
    assert k.assignments([*listing, k.broker_topic(7, "/ns/q")]) == {
        "/default/t": B,
        "/default/t2": B,
        "/state/x": B,
        "/ns/q": 7,
    }
    regs = [k.broker_register(5), k.broker_register(3), "/cluster/register/x", "/cluster/register/05"]
    assert k.broker_ids(regs) == [3, 5]
    assert k.broker_ids([k.load_report(9)], k.LOAD_PREFIX) == [9]


def test_unassigned_parsers() -> None:
    listing = [k.unassigned("/default/b"), k.unassigned("/default/a"), "/cluster/unassigned/default"]
    assert k.unassigned_topics(listing) == ["/default/a", "/default/b"]
    assert k.unassigned_topic_from_key("/cluster/load/1") is None


def test_producer_and_object_parsers() -> None:
    producers = [k.topic_producer(T, 9), k.topic_producer(T, 2**64 - 1), f"{k.topic_producers_prefix(T)}x"]
    assert k.producer_ids(producers, T) == [9, 2**64 - 1]
    objects = [k.storage_object(T, 30), k.storage_object(T, 0), k.storage_objects_cur(T)]
    assert k.storage_object_starts(objects, T) == [0, 30]


def test_padding_sorts_numerically() -> None:
    starts = [0, 9, 10, 100, 2**40, 2**64 - 1]
    assert sorted(k.storage_object(T, s) for s in starts) == [k.storage_object(T, s) for s in starts]


def test_schema_parsers() -> None:
    listing = [
        "/schemas/_global/next_schema_id",
        "/schemas/_index/by_id/1",
        k.schema_metadata("b"),
        k.schema_version("b", 10),
        k.schema_version("b", 2),
        k.schema_metadata("a"),
    ]
    assert k.schema_subjects(listing) == ["a", "b"]
    assert k.schema_versions(listing, "b") == [2, 10]
