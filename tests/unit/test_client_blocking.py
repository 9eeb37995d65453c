"""The blocking facade, against the FAKE broker of test_client_support (run in its own thread's loop)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from ister import errors
from ister.client.blocking import BlockingClient
from tests.unit.test_client_support import FakeServer


@pytest.fixture
def server() -> Iterator[FakeServer]:
    """The fake broker runs on an event loop of its own thread, like a separate process would."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    s = FakeServer()
    asyncio.run_coroutine_threadsafe(s.start(), loop).result(10)
    yield s
    asyncio.run_coroutine_threadsafe(s.stop(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def test_blocking_roundtrip(server: FakeServer) -> None:
    with BlockingClient(server.url, max_retries=3) as client:
        with client.producer("/default/t", linger_ms=0) as producer:
            consumer = client.consumer("/default/t", "sub")
            assert producer.send(b"one", {"a": "b"}) == 0
            assert producer.send_batch([b"two", b"three"]) == [1, 2]
            fut = producer.send_async(b"four")
            producer.flush()
            assert fut.result(5) == 3
        m = consumer.receive(timeout=5)
        assert (m.offset, m.payload, m.attributes) == (0, b"one", {"a": "b"})
        consumer.ack(m)
        rest = consumer.receive_batch(10, timeout=5)
        while len(rest) < 3:
            rest += consumer.receive_batch(10, timeout=5)
        assert [x.payload for x in rest] == [b"two", b"three", b"four"]
        consumer.ack_batch(rest)
        with pytest.raises(errors.Timeout):
            consumer.receive(timeout=0.1)
        consumer.close()
        assert list(consumer) == []


def test_blocking_iteration_and_errors(server: FakeServer) -> None:
    with BlockingClient(server.url) as client:
        producer = client.producer("/default/t")
        consumer = client.consumer("/default/t", "sub")
        producer.send_batch([b"%d" % i for i in range(100)])
        seen = []
        for m in consumer:
            seen.append(m.payload)
            consumer.ack(m)
            if len(seen) == 100:
                break
        assert seen == [b"%d" % i for i in range(100)]
        with pytest.raises(errors.NotFound):
            client.producer("/nope/t")
        with pytest.raises(errors.InvalidArgument):
            producer.send(b"x" * (2 * 1024 * 1024))
    assert client.closed
    # The next client in this process runs on the same loop thread (grpc.aio stays on one loop).
    with BlockingClient(server.url) as again:
        assert again._runner is client._runner and again._runner.thread.is_alive()
        assert again.producer("/default/t").send(b"after") == 100


def test_blocking_connect_failure() -> None:
    with pytest.raises(errors.Unavailable):
        BlockingClient("http://127.0.0.1:9", connect_timeout=0.2)
