"""Names and their parsers: topics, partitions, client-chosen names, ids."""

from __future__ import annotations

import pytest

from ister.errors import InvalidArgument
from ister.ids import (
    PARTITION_MARKER,
    TopicName,
    new_id,
    validate_client_name,
    validate_segment,
)
from ister.limits import MAX_NAME_LEN

# -- topic names ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "namespace", "topic"),
    [
        ("/default/orders", "default", "orders"),
        ("/a/b", "a", "b"),
        ("/ns_1/topic-2", "ns_1", "topic-2"),
        ("/UPPER/Mixed_Case-09", "UPPER", "Mixed_Case-09"),
        ("/-/_", "-", "_"),
        (f"/{'n' * MAX_NAME_LEN}/{'t' * MAX_NAME_LEN}", "n" * MAX_NAME_LEN, "t" * MAX_NAME_LEN),
    ],
)
def test_topic_name_valid(raw: str, namespace: str, topic: str) -> None:
    name = TopicName.parse(raw)
    assert (name.namespace, name.topic) == (namespace, topic)
    assert name.full == raw
    assert str(name) == raw
    assert name.path == f"{namespace}/{topic}"
    assert TopicName.parse(name.full) == name


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "/",
        "//",
        "///",
        "default/orders",  # no leading slash
        "orders",
        "/default",
        "/default/",
        "//orders",
        "/default//orders",
        "/default/orders/",
        "/default/a/b",
        "/default/dot.ted",
        "/default/.",
        "/default/..",
        "/./orders",
        "/../orders",
        "/default/has space",
        "/default/tab\there",
        "/default/new\nline",
        "/default/orders\n",
        "/default/nul\x00",
        "/default/caf\u00e9",  # unicode letter
        "/d\u00e9fault/orders",
        "/default/\u0662\u0663",  # unicode (Arabic-Indic) digits
        "/default/\uff41",  # fullwidth 'a'
        "/default/emoji\U0001f600",
        "/default/a:b",
        "/default/a*b",
        "/default/a\\b",
        "/default/a%2Fb",
        f"/default/{'t' * (MAX_NAME_LEN + 1)}",
        f"/{'n' * (MAX_NAME_LEN + 1)}/t",
        " /default/orders",
    ],
)
def test_topic_name_invalid(raw: str) -> None:
    with pytest.raises(InvalidArgument):
        TopicName.parse(raw)


def test_topic_name_error_is_clear() -> None:
    with pytest.raises(InvalidArgument, match="namespace/topic"):
        TopicName.parse("orders")
    with pytest.raises(InvalidArgument, match=r"invalid topic 'dot\.ted'"):
        TopicName.parse("/default/dot.ted")
    with pytest.raises(InvalidArgument, match="invalid namespace"):
        TopicName.parse("/bad ns/t")


def test_topic_names_are_values() -> None:
    assert TopicName.parse("/a/b") == TopicName("a", "b")
    assert len({TopicName.parse("/a/b"), TopicName("a", "b")}) == 1
    with pytest.raises(AttributeError):
        TopicName.parse("/a/b").topic = "c"  # type: ignore[misc]


# -- partitions ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("/default/orders-part-0", ("orders", 0)),
        ("/default/orders-part-7", ("orders", 7)),
        ("/default/orders-part-123456", ("orders", 123456)),
        ("/default/a-part-1-part-2", ("a-part-1", 2)),
        ("/default/x--part-3", ("x-", 3)),
    ],
)
def test_partition_parsed(raw: str, expected: tuple[str, int]) -> None:
    assert TopicName.parse(raw).partition == expected


@pytest.mark.parametrize(
    "raw",
    [
        "/default/orders",
        "/default/orders-part-",
        "/default/orders-part-01",  # leading zero: not the canonical form
        "/default/orders-part-1234567",  # more than six digits
        "/default/orders-part-x",
        "/default/orders-part-1-DLQ",
        "/default/-part-0",  # no base
        "/default/orders_part_0",
        "/default/orders-PART-0",
    ],
)
def test_not_a_partition(raw: str) -> None:
    assert TopicName.parse(raw).partition is None


def test_partition_topic_roundtrip() -> None:
    base = TopicName.parse("/default/orders")
    for i in (0, 1, 9, 10, 999):
        part = base.partition_topic(i)
        assert part.full == f"/default/orders{PARTITION_MARKER}{i}"
        assert part.namespace == "default"
        assert part.partition == ("orders", i)
        assert TopicName.parse(part.full) == part


def test_dlq_name() -> None:
    dlq = TopicName.parse("/default/orders").dlq()
    assert dlq.full == "/default/orders-DLQ"
    assert dlq.partition is None
    assert TopicName.parse("/default/orders-part-2").dlq().full == "/default/orders-part-2-DLQ"
    assert TopicName.parse(dlq.full) == dlq


def test_dead_letter_name_of_a_too_long_topic_is_a_clear_error() -> None:
    long = TopicName.parse(f"/default/{'t' * (MAX_NAME_LEN - 4)}-DLQ")
    with pytest.raises(InvalidArgument, match="dead-letter topic"):
        long.dlq()


# -- segments and client names -------------------------------------------------------------------------------


def test_validate_segment_returns_value_and_names_what() -> None:
    assert validate_segment("abc", "namespace") == "abc"
    with pytest.raises(InvalidArgument, match="namespace"):
        validate_segment("", "namespace")
    with pytest.raises(InvalidArgument, match="cluster"):
        validate_segment("a.b", "cluster")


@pytest.mark.parametrize(
    "value",
    [
        "c1",
        "consumer with spaces",
        "dotted.name",
        "caf\u00e9-\u6d88\u8d39\u8005",
        "emoji-\U0001f600",
        "x" * MAX_NAME_LEN,
        "a:b@c#d",
        "..",
    ],
)
def test_client_name_valid(value: str) -> None:
    assert validate_client_name(value, "consumer name") == value


@pytest.mark.parametrize(
    "value",
    [
        "",
        "a/b",
        "/",
        "tab\there",
        "new\nline",
        "nul\x00",
        "del\x7f",
        "esc\x1b[0m",
        "x" * (MAX_NAME_LEN + 1),
    ],
)
def test_client_name_invalid(value: str) -> None:
    with pytest.raises(InvalidArgument, match="subscription name"):
        validate_client_name(value, "subscription name")


# -- ids -----------------------------------------------------------------------------------------------------


def test_new_id_is_nonzero_u64_and_random() -> None:
    ids = {new_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(0 < i < 2**64 for i in ids)
