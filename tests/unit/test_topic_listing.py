"""`IsterAdmin.ListTopics` on a real standalone broker (embedded metadata store): one page of the topics,
filtered, sorted and counted on the broker, and its refusals."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ister.broker.admin_ops import AdminOps
from ister.broker.service import BrokerService
from ister.config import load_config
from ister.errors import InvalidArgument, NotFound
from ister.metadata.embedded import EmbeddedStore
from ister.server.health_api import topic_page_pb
from tests.support import until


@pytest.fixture
async def ops(tmp_path: Path) -> AsyncIterator[AdminOps]:
    store = EmbeddedStore.in_memory()
    broker = BrokerService(load_config(environ={}), store, tmp_path)
    await broker.start()
    admin = AdminOps(broker)
    try:
        await admin.create_namespace("other")
        for i in range(12):
            await admin.create_topic(f"/default/t{i:02d}", reliable=i % 3 == 0)
        await admin.create_topic("/other/T05-copy", reliable=False)
        yield admin
    finally:
        await broker.close()
        await store.close()


async def test_a_page_by_name_with_the_counts(ops: AdminOps) -> None:
    page = await ops.list_topics(offset=2, limit=3)
    assert [t.name for t in page.topics] == ["/default/t02", "/default/t03", "/default/t04"]
    assert (page.total, page.matched, page.per_broker, page.unassigned) == (13, 13, {0: 13}, 0)
    assert page.namespaces == 2  # default and other, from the same listing
    assert [t.delivery for t in page.topics] == ["NonReliable", "Reliable", "NonReliable"]
    last = await ops.list_topics(descending=True, limit=1)
    assert [t.name for t in last.topics] == ["/other/T05-copy"]
    assert (await ops.list_topics(offset=50, limit=10)).topics == []  # past the end: an empty page
    counts = await ops.list_topics(limit=0)
    assert counts.topics == [] and counts.total == 13


async def test_the_filter_is_a_case_insensitive_substring_and_a_namespace_narrows(ops: AdminOps) -> None:
    page = await ops.list_topics(name_filter="t05", limit=10)
    assert [t.name for t in page.topics] == ["/default/t05", "/other/T05-copy"] and page.matched == 2
    only = await ops.list_topics(namespace="other", limit=10)
    assert [t.name for t in only.topics] == ["/other/T05-copy"] and only.total == only.namespaces == 1


async def test_sorted_by_delivery_then_name(ops: AdminOps) -> None:
    page = await ops.list_topics(sort="delivery", limit=5)
    assert [(t.delivery, t.name) for t in page.topics] == [
        ("NonReliable", "/default/t01"),
        ("NonReliable", "/default/t02"),
        ("NonReliable", "/default/t04"),
        ("NonReliable", "/default/t05"),
        ("NonReliable", "/default/t07"),
    ]
    wire = topic_page_pb(page)
    assert wire.matched == 13 and wire.topics[0].broker_id == 0 and wire.topics[0].HasField("broker_id")


async def test_a_topic_made_again_is_sorted_by_its_new_delivery(ops: AdminOps) -> None:
    async def first_nonreliable() -> list[str]:
        page = await ops.list_topics(sort="delivery", limit=13)
        return [t.name for t in page.topics if t.delivery == "NonReliable"]

    before = await first_nonreliable()
    assert "/default/t01" in before and await first_nonreliable() == before  # the second from memory
    await ops.delete_topic("/default/t01")
    await ops.create_topic("/default/t01", reliable=True)

    async def moved() -> list[str] | None:
        after = await first_nonreliable()
        return after if "/default/t01" not in after else None

    # Once the broker's mirror has the new topic key (its watch), the old delivery is not used again.
    after = await until(moved, "t01 sorted by its new delivery")
    assert len(after) == len(before) - 1
    page = await ops.list_topics(name_filter="default/t01", limit=5)
    assert [(t.name, t.delivery) for t in page.topics] == [("/default/t01", "Reliable")]


async def test_bad_requests_are_refused(ops: AdminOps) -> None:
    with pytest.raises(InvalidArgument, match="sort must be one of"):
        await ops.list_topics(sort="size")
    with pytest.raises(InvalidArgument, match="limit must be"):
        await ops.list_topics(limit=1001)
    with pytest.raises(NotFound):
        await ops.list_topics(namespace="nope")
