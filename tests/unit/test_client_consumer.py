"""Consumer logic against the FAKE broker of test_client_support (see there why a fake): iteration and
batches, coalesced ack ranges with gaps, nacks, redelivery after reconnect, partition merge, errors."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from collections.abc import AsyncIterator

import pytest

from ister import errors
from ister.client import Client, SubType
from ister.client import messages as client_messages
from tests.support import until
from tests.unit.test_client_support import FakeServer


@pytest.fixture
async def server() -> AsyncIterator[FakeServer]:
    s = FakeServer()
    await s.start()
    yield s
    await s.stop()


@pytest.fixture
async def client(server: FakeServer) -> AsyncIterator[Client]:
    async with Client(server.url, max_retries=20, backoff_base=0.02, backoff_max=0.2) as c:
        yield c


async def take(consumer: object, n: int, within: float = 5.0) -> list:  # type: ignore[type-arg]
    out: list = []  # type: ignore[type-arg]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while len(out) < n:
        if loop.time() > deadline:
            raise AssertionError(f"received {len(out)} of {n}")
        out.extend(await consumer.receive_batch(n - len(out), 0.5))  # type: ignore[attr-defined]
    return out


async def test_iterate_and_ack(server: FakeServer, client: Client) -> None:
    p = await client.producer("/default/t", "prod")
    c = await client.consumer("/default/t", "sub", type="exclusive", name="c1")
    await p.send_batch([b"a", b"b"], attributes={"k": "v"}, key="key1")
    got = []
    async for msg in c:
        got.append(msg)
        await msg.ack()
        if len(got) == 2:
            break
    assert [m.payload for m in got] == [b"a", b"b"]
    m = got[0]
    assert (m.offset, m.topic, m.attributes, m.key, m.producer_name, m.redelivered) == (
        0,
        "/default/t",
        {"k": "v"},
        "key1",
        "prod",
        False,
    )
    assert m.publish_time > 1_600_000_000_000
    sub = server.servicer.subs[("/default/t", "sub")]
    await until(lambda: sub.acked == {0, 1}, "acks")
    await c.close()
    assert [x async for x in c] == []  # iteration ends once closed


async def test_acks_are_coalesced_into_ranges_with_gaps(server: FakeServer, client: Client) -> None:
    p = await client.producer("/default/t")
    c = await client.consumer("/default/t", "sub", window=5000)
    await p.send_batch([b"%d" % i for i in range(3000)])
    got = await take(c, 3000)
    await c.ack_batch([m for m in got if m.offset % 10 != 3])
    sub = server.servicer.subs[("/default/t", "sub")]
    await until(lambda: len(sub.acked) == 2700, "acks")
    assert sub.ack_frames <= 5  # thousands of acks in a handful of frames
    assert sub.unacked == {o for o in range(3000) if o % 10 == 3}


async def test_unacked_are_redelivered_after_reconnect(server: FakeServer, client: Client) -> None:
    p = await client.producer("/default/t")
    c = await client.consumer("/default/t", "sub", name="stable")
    await p.send_batch([b"%d" % i for i in range(10)])
    got = await take(c, 10)
    for m in got:
        if m.offset % 2 == 0:
            await m.ack()
    sub = server.servicer.subs[("/default/t", "sub")]
    await until(lambda: len(sub.acked) == 5, "acks")
    await server.restart(down_for=0.2)
    again = await take(c, 5, within=10.0)
    assert sorted(m.offset for m in again) == [1, 3, 5, 7, 9]
    assert all(m.redelivered for m in again)
    await c.ack_batch(again)
    await until(lambda: not sub.unacked, "all acked")
    assert server.servicer.consume_opens == 2


async def test_acks_made_while_disconnected_are_sent_after_reconnect(
    server: FakeServer, client: Client
) -> None:
    p = await client.producer("/default/t")
    c = await client.consumer("/default/t", "sub")
    await p.send_batch([b"x"] * 4)
    got = await take(c, 4)
    await server.stop()
    await c.ack_batch(got)  # buffered: the stream is down
    await server.start()
    sub = server.servicer.subs[("/default/t", "sub")]
    await until(lambda: sub.acked == {0, 1, 2, 3}, "acks after reconnect", 10.0)


async def test_nack_redelivers(server: FakeServer, client: Client) -> None:
    p = await client.producer("/default/t")
    c = await client.consumer("/default/t", "sub")
    await p.send(b"retry me")
    first = await c.receive(timeout=5)
    await first.nack(delay_ms=0, reason="not now")
    second = await c.receive(timeout=5)
    assert (second.offset, second.payload, second.redelivered) == (first.offset, b"retry me", True)
    sub = server.servicer.subs[("/default/t", "sub")]
    assert sub.nacked == [first.offset]


async def test_window_bounds_unacked_delivery(server: FakeServer, client: Client) -> None:
    p = await client.producer("/default/t")
    c = await client.consumer("/default/t", "sub", window=10)
    await p.send_batch([b"w"] * 50)
    got = await take(c, 10)
    assert await c.receive_batch(100, timeout=0.3) == []  # nothing past the window until acks
    await c.ack_batch(got)
    assert len(await take(c, 10)) == 10


async def test_ack_upto(server: FakeServer, client: Client) -> None:
    p = await client.producer("/default/t")
    c = await client.consumer("/default/t", "sub")
    await p.send_batch([b"u"] * 20)
    got = await take(c, 20)
    await c.ack_upto(got[14])
    sub = server.servicer.subs[("/default/t", "sub")]
    await until(lambda: sub.acked == set(range(15)), "cumulative ack")
    await c.ack_upto(19)
    await until(lambda: not sub.unacked, "cumulative ack by offset")


async def test_partitioned_consumer_merges(server: FakeServer, client: Client) -> None:
    p = await client.producer("/default/pt", partitions=3, max_batch_messages=5)
    c = await client.consumer("/default/pt", "sub", type=SubType.SHARED)
    assert c.partitions == [f"/default/pt-part-{i}" for i in range(3)]
    await p.send_batch([b"%d" % i for i in range(30)])
    got = await take(c, 30)
    assert sorted(m.payload for m in got) == sorted(b"%d" % i for i in range(30))
    assert {m.topic for m in got} == set(c.partitions)
    with pytest.raises(errors.InvalidArgument):
        await c.ack_upto(3)  # which partition?
    await c.ack_batch(got)
    for part in c.partitions:
        sub = server.servicer.subs[(part, "sub")]
        await until(lambda sub=sub: not sub.unacked, f"acks on {part}")  # type: ignore[misc]


async def test_consumer_errors(server: FakeServer, client: Client) -> None:
    with pytest.raises(errors.NotFound):
        await client.consumer("/default/missing", "sub")
    with pytest.raises(errors.NotFound):
        await client.consumer("/other/t", "sub")
    with pytest.raises(errors.InvalidArgument):
        await client.consumer("/default/t", "sub", type="fanout")
    with pytest.raises(errors.InvalidArgument):
        await client.consumer("/default/t", "sub", window=0)
    with pytest.raises(errors.InvalidArgument):
        await client.consumer("/default/t", "bad/sub")


async def test_receive_timeout_and_closed(server: FakeServer, client: Client) -> None:
    await client.producer("/default/t")
    c = await client.consumer("/default/t", "sub")
    with pytest.raises(errors.Timeout):
        await c.receive(timeout=0.05)
    assert await c.receive_batch(10, timeout=0.05) == []
    await c.close()
    with pytest.raises(errors.FailedPrecondition):
        await c.receive(timeout=0.05)


async def test_retries_exhausted_reach_the_iterator(server: FakeServer) -> None:
    async with Client(server.url, connect_timeout=0.3, max_retries=1, backoff_base=0.01) as client:
        await client.producer("/default/t")
        c = await client.consumer("/default/t", "sub")
        await server.stop()
        with pytest.raises(errors.Unavailable):
            async for _ in c:
                pass


async def test_many_ranges_are_split_across_frames(server: FakeServer, client: Client) -> None:
    p = await client.producer("/default/t")
    c = await client.consumer("/default/t", "sub", window=10_000)
    await p.send_batch([b"r"] * 10_000)
    got = await take(c, 10_000)
    await c.ack_batch([m for m in got if m.offset % 2 == 0])  # 5,000 separate ranges
    sub = server.servicer.subs[("/default/t", "sub")]
    await until(lambda: len(sub.acked) == 5_000, "acks")
    assert sub.ack_frames >= 2


async def test_a_consumer_that_caught_up_holds_none_of_its_messages(
    server: FakeServer, client: Client
) -> None:
    """Once the application has taken every message (by iterating, receive() or receive_batch()) and acked
    them, the client keeps none of them while it waits for more: it held the last batch twice (the
    receiving task's locals, the consumer's current batch), up to `window` decoded messages."""
    p = await client.producer("/default/held", "prod")
    c = await client.consumer("/default/held", "sub", window=1000)
    tracemalloc.start(1)
    try:
        await p.send_batch([b"h" * 1000] * 300)
        first = []
        async for msg in c:
            first.append(msg)
            if len(first) == 100:
                break
        one = await c.receive(5)
        rest = await take(c, 199)
        got = [*first, one, *rest]
        assert [m.offset for m in got] == list(range(300))
        for m in got:
            await m.ack()
        sub = server.servicer.subs[("/default/held", "sub")]
        await until(lambda: sub.acked == set(range(300)), "acks sent")
        del first, one, rest, got, msg, m
        gc.collect()
        kept = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, client_messages.__file__)])
        held = sum(s.size for s in kept.statistics("filename"))
        assert held < 10_000, f"{held} bytes of received messages are still held"
    finally:
        tracemalloc.stop()
