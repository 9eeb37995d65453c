"""Enforced limits in an in-process broker (embedded metadata, WAL on tmp_path) on a virtual clock: publish
and dispatch rates counted in virtual time, topic counts, each changed at run time (docs/limits.md)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ister.broker import metrics
from ister.broker.service import BrokerService
from ister.clock import VirtualClock
from ister.config import load_config
from ister.core.dispatch import SubType
from ister.core.record import StoredMessage
from ister.errors import FailedPrecondition, ResourceExhausted
from ister.ids import TopicName
from ister.metadata import keys
from ister.metadata import topic_catalog as catalog
from ister.metadata.embedded import EmbeddedStore
from tests.support import until


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[tuple[BrokerService, VirtualClock]]:
    clock = VirtualClock()
    store = EmbeddedStore.in_memory()
    config = load_config(overrides={"limits": {"max_publish_wait_seconds": 5.0}}, environ={})
    broker = BrokerService(config, store, tmp_path, clock=clock)
    await broker.start()
    yield broker, clock
    await broker.close()
    await store.close()


async def _set_policy(broker: BrokerService, **fields: Any) -> None:
    def change(value: dict[str, Any]) -> dict[str, Any]:
        value.update(fields)
        return value

    await catalog.update_namespace_policy(broker.store, "default", change)
    ns = keys.namespace_policy("default")
    await until(
        lambda: all(broker.retention_view.cache.get(ns).value.get(k) == v for k, v in fields.items()),
        "the broker's mirror has the policy",
    )


def _msg(i: int, size: int = 1) -> StoredMessage:
    return StoredMessage(payload=b"x" * size, publish_time=i, producer_id=1, producer_name="p")


def _refusals(limit: str) -> float:
    return metrics.limit_refusals.labels(limit)._value.get()  # type: ignore[no-any-return]


async def test_publish_rate_holds_back_then_refuses_then_a_raise_applies(env: Any) -> None:
    broker, clock = env
    await _set_policy(broker, max_publish_rate=5)
    pid = await broker.create_producer("/default/rated", "p", reliable=True, access_mode=0)
    session = await broker.producer(pid, "/default/rated")
    topic = broker.topics["/default/rated"]
    for i in range(5):  # at the limit: the burst of one second goes at once
        await broker.send(session, _msg(i))
    sixth = asyncio.ensure_future(broker.send(session, _msg(5)))
    await clock.advance(0.1)
    assert not sixth.done() and topic.messages_in == 5  # just over: held, nothing stored yet
    await clock.advance(0.15)
    assert await sixth == 5
    throttled = metrics.publish_throttled._value.get()
    assert throttled >= 1
    # A batch larger than the burst waits for a full bucket and leaves a debt; a publish behind it whose
    # turn is more than max_publish_wait_seconds (5 s) away is refused at once, nothing of it stored.
    held = asyncio.ensure_future(topic.admit(100, 100))
    await clock.advance(0)
    before = _refusals("max_publish_rate")
    with pytest.raises(ResourceExhausted, match=r"namespace default allows max_publish_rate=5 messages/s"):
        await broker.send(session, _msg(6))
    assert _refusals("max_publish_rate") == before + 1
    assert topic.messages_in == 6
    held.cancel()
    # Raised at run time (the policy is watched): the debt is repaid at the new rate, then no waiting.
    await _set_policy(broker, max_publish_rate=1_000)

    async def hundred() -> None:
        for i in range(6, 106):
            await broker.send(session, _msg(i))

    sends = asyncio.ensure_future(hundred())
    for _ in range(10):  # a virtual second at most (the debt takes 0.1 s at 1,000/s)
        await clock.advance(0.1)
    await asyncio.wait_for(sends, 10)
    assert topic.messages_in == 106


async def test_publish_byte_rate_and_a_topic_override(env: Any) -> None:
    broker, clock = env
    await _set_policy(broker, max_publish_rate_bytes=1_000)
    pid = await broker.create_producer("/default/bytes", "p", reliable=True, access_mode=0)
    session = await broker.producer(pid, "/default/bytes")
    topic = broker.topics["/default/bytes"]
    await broker.send(session, _msg(0, 1_000))
    second = asyncio.ensure_future(broker.send(session, _msg(1, 500)))
    await clock.advance(0.4)
    assert not second.done()
    await clock.advance(0.2)
    assert await second == 1
    held = asyncio.ensure_future(topic.admit(1, 10_000))  # waits for a full bucket, leaves 10 s of debt
    await clock.advance(0)
    with pytest.raises(
        ResourceExhausted, match="max_publish_rate_bytes=1000 bytes/s; this publish of 1 message, 1 byte "
    ):
        await topic.admit(1, 1)
    held.cancel()
    # The topic's own limit replaces the namespace's (0: unlimited for this topic).
    await broker.store.put(
        keys.topic_rate_limits(TopicName.parse("/default/bytes")), {"max_publish_rate_bytes": 0}
    )
    await until(lambda: topic.limits is not None and topic.limits.rates().publish.unlimited, "the override")
    await asyncio.wait_for(topic.admit(1, 10**9), 5)


async def test_dispatch_rate_paces_a_subscription_and_never_drops(env: Any) -> None:
    broker, clock = env
    await _set_policy(broker, max_subscription_dispatch_rate=4)
    pid = await broker.create_producer("/default/paced", "p", reliable=True, access_mode=0)
    session = await broker.producer(pid, "/default/paced")
    cid = await broker.subscribe("/default/paced", "s", "c", SubType.EXCLUSIVE, [])
    ref, _stream = await broker.open_stream(cid)
    sub = ref.subscription
    sub.set_window(1_000)
    for i in range(20):
        await broker.send(session, _msg(i))
    await clock.advance(0.01)
    await until(lambda: sub.messages_out >= 4, "the burst delivered")
    assert sub.messages_out == 4  # one second's worth, then a pause
    seen = []
    for _ in range(8):
        await clock.advance(0.5)
        seen.append(sub.messages_out)
    assert seen == sorted(seen) and seen[-1] <= 4 + 4 * 4 and seen[-1] >= 4 + 4 * 3  # ~4/s, none lost
    await _set_policy(broker, max_subscription_dispatch_rate=0)  # lifted at run time
    await clock.advance(0.6)
    await until(lambda: sub.messages_out == 20, "the rest delivered")


async def test_max_topics_per_namespace_at_over_and_raised(env: Any) -> None:
    broker, _clock = env
    await _set_policy(broker, max_topics_per_namespace=2)
    await broker.create_producer("/default/one", "p", reliable=True, access_mode=0)
    await broker.create_producer("/default/two", "p", reliable=False, access_mode=0)  # at the limit
    before = _refusals("max_topics_per_namespace")
    with pytest.raises(
        FailedPrecondition, match="namespace default allows max_topics_per_namespace=2 topics"
    ):
        await broker.create_producer("/default/three", "p", reliable=True, access_mode=0)
    assert _refusals("max_topics_per_namespace") == before + 1
    assert await broker.store.get(keys.namespace_topic("/default/three")) is None  # nothing written
    await _set_policy(broker, max_topics_per_namespace=3)
    await broker.create_producer("/default/three", "p", reliable=True, access_mode=0)


async def test_count_limits_are_counted_in_the_refusal_metric(env: Any) -> None:
    broker, _clock = env
    await _set_policy(broker, max_producers_per_topic=1, max_consumers_per_subscription=1)
    await broker.create_producer("/default/counted", "p1", reliable=True, access_mode=0)
    before = _refusals("max_producers_per_topic")
    with pytest.raises(FailedPrecondition, match="max_producers_per_topic=1"):
        await broker.create_producer("/default/counted", "p2", reliable=True, access_mode=0)
    assert _refusals("max_producers_per_topic") == before + 1
    await broker.subscribe("/default/counted", "s", "c1", SubType.SHARED, [])
    before = _refusals("max_consumers_per_subscription")
    with pytest.raises(FailedPrecondition, match="max_consumers_per_subscription=1"):
        await broker.subscribe("/default/counted", "s", "c2", SubType.SHARED, [])
    assert _refusals("max_consumers_per_subscription") == before + 1


async def test_every_count_refusal_names_the_namespace_whose_limit_it_is(env: Any) -> None:
    """docs/limits.md: each refusal names the limit, its value and whose it is (the namespace's policy)."""
    broker, _clock = env
    await _set_policy(
        broker,
        max_producers_per_topic=1,
        max_subscriptions_per_topic=2,
        max_consumers_per_topic=2,
        max_consumers_per_subscription=1,
    )
    t = "/default/whose"
    await broker.create_producer(t, "p1", reliable=True, access_mode=0)
    with pytest.raises(
        FailedPrecondition,
        match=f"^{t}: namespace default allows max_producers_per_topic=1 producers; it has 1$",
    ):
        await broker.create_producer(t, "p2", reliable=True, access_mode=0)
    await broker.subscribe(t, "s1", "c1", SubType.SHARED, [])
    with pytest.raises(
        FailedPrecondition,
        match=f"^{t}: namespace default allows max_consumers_per_subscription=1 consumers of "
        "subscription 's1'; it has 1$",
    ):
        await broker.subscribe(t, "s1", "c2", SubType.SHARED, [])
    await broker.subscribe(t, "s2", "c3", SubType.SHARED, [])
    with pytest.raises(
        FailedPrecondition,
        match=f"^{t}: namespace default allows max_subscriptions_per_topic=2 subscriptions; it has 2$",
    ):
        await broker.subscribe(t, "s3", "c4", SubType.SHARED, [])
    await _set_policy(broker, max_subscriptions_per_topic=0, max_consumers_per_subscription=0)
    with pytest.raises(
        FailedPrecondition,
        match=f"^{t}: namespace default allows max_consumers_per_topic=2 consumers; it has 2$",
    ):
        await broker.subscribe(t, "s1", "c5", SubType.SHARED, [])
