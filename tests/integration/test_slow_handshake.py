"""A broker slow to answer a new connection (a remote one with long round trips, TLS's extra round trips, a
loaded machine) is still reached by the Ister client, the admin CLI and the console.

gRPC gives each connection attempt max(backoff, `grpc.min_reconnect_backoff_ms`) to finish TCP, TLS and
the HTTP/2 SETTINGS exchange. The client's channels set that minimum to 100 ms with a 2 s maximum backoff,
so every attempt to a broker that answered later than 2 s was cut off until the caller gave up. A proxy
that holds each new connection before passing bytes on plays that broker.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ister.cli.admin_call import connect as admin_connect
from ister.client import Client
from ister.console.source import AdminSource
from ister.wire.gen import DanubeAdmin_pb2 as apb
from tests.integration.harness import BrokerProcess
from tests.slow_proxy import SlowProxy

pytestmark = pytest.mark.integration

HOLD_SECONDS = 2.5  # past the client's 2 s maximum backoff, well within its 10 s connect timeout


@pytest.fixture
async def slow_broker(tmp_path: Path) -> AsyncIterator[tuple[BrokerProcess, SlowProxy, SlowProxy]]:
    """A broker that advertises its client proxy (lookups send the client back through it), and the
    proxies in front of its client and admin ports."""
    client_proxy = SlowProxy(0, HOLD_SECONDS)
    await client_proxy.start()
    broker = BrokerProcess(tmp_path / "data", "--advertised-addr", f"127.0.0.1:{client_proxy.port}")
    client_proxy.upstream_port = broker.port
    admin_proxy = SlowProxy(broker.admin_port, HOLD_SECONDS)
    await admin_proxy.start()
    await asyncio.to_thread(broker.start)
    try:
        yield broker, client_proxy, admin_proxy
    finally:
        await client_proxy.close()
        await admin_proxy.close()
        broker.stop()


async def test_the_client_reaches_a_broker_slow_to_answer_a_new_connection(
    slow_broker: tuple[BrokerProcess, SlowProxy, SlowProxy],
) -> None:
    _, proxy, _ = slow_broker
    topic = "/default/slow_handshake"
    started = time.monotonic()
    async with Client(f"http://127.0.0.1:{proxy.port}", connect_timeout=10) as client:
        connected = time.monotonic() - started
        producer = await client.producer(topic)
        consumer = await client.consumer(topic, "slow", name="reader")
        assert await producer.send(b"through a slow accept") == 0
        message = await consumer.receive(timeout=10)
        assert message.payload == b"through a slow accept"
        await consumer.ack(message)
    print(f"connected after {connected:.2f} s through a {HOLD_SECONDS} s accept; {proxy.accepted} accepted")
    assert proxy.accepted >= 1
    assert connected >= HOLD_SECONDS


async def test_the_admin_cli_and_the_console_reach_a_slow_admin_port(
    slow_broker: tuple[BrokerProcess, SlowProxy, SlowProxy],
) -> None:
    _, _, proxy = slow_broker
    addr = f"127.0.0.1:{proxy.port}"

    def list_brokers() -> int:
        with admin_connect(addr) as stubs:
            return len(stubs.brokers.ListBrokers(apb.Empty(), timeout=10).brokers)

    assert await asyncio.to_thread(list_brokers) == 1  # the CLI's blocking channel, in a thread: the
    # proxy runs on this loop
    source = AdminSource(addr)
    await source.open()
    try:
        overview = await source.overview()
    finally:
        await source.close()
    assert overview.reachable, overview.error
    assert len(overview.brokers) == 1
    assert proxy.accepted >= 2
