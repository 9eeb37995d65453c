"""SetCursor of the batch API against a real standalone broker process: a reader that keeps its own position
(Spark's checkpoint) moves a named cursor, and its lag shows on the broker's metrics and in the cursor a
consumer of that subscription starts from."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from ister import errors
from ister.client import Client
from ister.client.blocking import BlockingClient
from tests.integration.harness import BrokerProcess, subscription_metric
from tests.support import until

pytestmark = pytest.mark.integration
LAG = "danube_subscription_lag_messages"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path_factory.mktemp("cursor") / "data")
    process.start()
    yield process
    process.stop()


def lag_of(broker: BrokerProcess, topic: str, sub: str) -> float | None:
    return subscription_metric(broker.metrics_url, LAG, topic, sub)


async def test_a_named_cursor_shows_lag_and_is_where_a_consumer_starts(
    broker: BrokerProcess, topic: str
) -> None:
    async with Client(broker.url) as client:
        producer = await client.producer(topic, "cursor-producer")
        await producer.send_batch([b"m%d" % i for i in range(100)])
        assert await client.set_cursor(topic, "spark-lag", 60) == 40
        assert lag_of(broker, topic, "spark-lag") == 40
        await producer.send_batch([b"m%d" % i for i in range(100, 110)])
        await until(
            lambda: lag_of(broker, topic, "spark-lag") == 50, "lag 50 after 10 more messages", within=30
        )
        assert await client.set_cursor(topic, "spark-lag", 110) == 0  # forward to the head
        assert await client.set_cursor(topic, "spark-lag", 70) == 40  # and back (a replayed checkpoint)

        consumer = await client.consumer(topic, "spark-lag")
        async with asyncio.timeout(15):
            first = await anext(aiter(consumer))
        assert first.offset == 70 and first.payload == b"m70"
        with pytest.raises(errors.FailedPrecondition, match="active consumers"):
            await client.set_cursor(topic, "spark-lag", 80)
        await consumer.close()
        await producer.close()


async def test_set_cursor_refuses_bad_requests_and_changes_nothing(broker: BrokerProcess, topic: str) -> None:
    async with Client(broker.url) as client:
        producer = await client.producer(topic, "cursor-producer")
        await producer.send_batch([b"x"] * 5)
        assert await client.set_cursor(topic, "tracked", 2) == 3
        with pytest.raises(errors.InvalidArgument, match="past the head"):
            await client.set_cursor(topic, "tracked", 6)
        with pytest.raises(errors.InvalidArgument):
            await client.set_cursor(topic, "bad name/with slash", 1)
        with pytest.raises(errors.InvalidArgument):
            await client.set_cursor(topic, "tracked", -1)
        with pytest.raises(errors.NotFound):
            await client.set_cursor(topic + "_missing", "tracked", 0)
        await client.producer(topic + "_nr", "nr", reliable=False)
        with pytest.raises(errors.FailedPrecondition, match="not reliable"):
            await client.set_cursor(topic + "_nr", "tracked", 0)
        assert lag_of(broker, topic, "tracked") == 3  # unchanged by the refused calls
        consumer = await client.consumer(topic, "tracked")
        async with asyncio.timeout(15):
            assert (await anext(aiter(consumer))).offset == 2
        await consumer.close()
        await producer.close()


def test_a_named_cursor_survives_a_broker_restart(tmp_path_factory: pytest.TempPathFactory) -> None:
    process = BrokerProcess(tmp_path_factory.mktemp("cursor-restart") / "data")
    process.start()
    try:
        with BlockingClient(process.url) as client:
            with client.producer("/default/restarted", "p") as producer:
                producer.send_batch([b"r%d" % i for i in range(20)])
            assert client.set_cursor("/default/restarted", "spark-lag", 15) == 5
        process.stop()
        process.start()
        with BlockingClient(process.url) as client:
            consumer = client.consumer("/default/restarted", "spark-lag")
            assert consumer.receive(timeout=15).offset == 15
            consumer.close()
    finally:
        process.stop()
