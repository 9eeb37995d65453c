"""Producer logic against the FAKE broker of test_client_support (see there why a fake): batching, linger,
flow control, ordered acks, reconnect with re-send, rejected batches, retries, partition routing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from ister import errors
from ister.client import Client
from ister.client.routing import fnv1a_64
from tests.support import until
from tests.unit.test_client_support import FakeServer, stored_messages, stored_payloads


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


async def test_send_returns_offsets_in_order(server: FakeServer, client: Client) -> None:
    p = await client.producer("/default/t", "p1")
    assert [await p.send(f"m{i}".encode(), {"i": str(i)}) for i in range(5)] == [0, 1, 2, 3, 4]
    assert await p.send_batch([b"a", b"b", b"c"]) == [5, 6, 7]
    futs = [p.send_nowait(b"x") for _ in range(3)]
    assert await asyncio.gather(*futs) == [8, 9, 10]
    assert stored_payloads(server.servicer, "/default/t")[:3] == [b"m0", b"m1", b"m2"]
    assert p.buffered == 0
    await p.close()


async def test_linger_groups_concurrent_sends_into_one_batch(server: FakeServer, client: Client) -> None:
    p = await client.producer("/default/t", linger_ms=50)
    futs = [p.send_nowait(b"%d" % i) for i in range(100)]
    offsets = await asyncio.gather(*futs)
    assert offsets == list(range(100))
    assert server.servicer.batches == [("/default/t", 100)]


async def test_linger_zero_still_batches_one_loop_iteration(server: FakeServer, client: Client) -> None:
    p = await client.producer("/default/t", linger_ms=0)
    await asyncio.gather(*(p.send(b"x") for _ in range(50)))
    assert server.servicer.batches == [("/default/t", 50)]


async def test_batches_split_by_count_and_bytes(server: FakeServer, client: Client) -> None:
    p = await client.producer("/default/t", max_batch_messages=1000)
    offsets = await p.send_batch([b"y" * 10] * 2500)
    assert offsets == list(range(2500))
    assert [n for _, n in server.servicer.batches] == [1000, 1000, 500]
    server.servicer.batches.clear()
    p = await client.producer("/default/t", max_batch_messages=1000, max_batch_bytes=64 * 1024)
    await p.send_batch([b"z" * 1000] * 200)  # ~1 KiB each: 64 KiB holds about 60
    counts = [n for _, n in server.servicer.batches]
    assert sum(counts) == 200 and max(counts) < 64 and len(counts) >= 4


async def test_broker_batch_limits_win_over_larger_client_limits(server: FakeServer, client: Client) -> None:
    server.servicer.max_batch_count = 100
    p = await client.producer("/default/t", max_batch_messages=4096)
    await p.send_batch([b"q"] * 350)
    assert [n for _, n in server.servicer.batches] == [100, 100, 100, 50]


async def test_inflight_window_is_respected(server: FakeServer, client: Client) -> None:
    server.servicer.max_inflight = 2
    server.servicer.ack_delay = 0.01
    p = await client.producer("/default/t", max_batch_messages=10)
    assert len(await p.send_batch([b"w"] * 200)) == 200
    assert server.servicer.max_unacked_batches <= 2
    assert len(server.servicer.batches) == 20


async def test_rejected_batch_fails_only_its_sends(server: FakeServer, client: Client) -> None:
    def verdict(topic: str, index: int, msgs: list) -> object:  # type: ignore[type-arg]
        return grpc.StatusCode.INVALID_ARGUMENT if any(m.payload == b"bad" for m in msgs) else None

    server.servicer.on_batch = verdict
    p = await client.producer("/default/t", max_batch_messages=1)
    futs = [p.send_nowait(x) for x in (b"ok1", b"bad", b"ok2", b"ok3")]
    results = await asyncio.gather(*futs, return_exceptions=True)
    assert results[0] == 0
    assert isinstance(results[1], errors.InvalidArgument)
    assert "injected" in str(results[1])
    assert results[2:] == [1, 2]
    assert stored_payloads(server.servicer, "/default/t") == [b"ok1", b"ok2", b"ok3"]


async def test_reconnect_resends_unacknowledged_batches(server: FakeServer, client: Client) -> None:
    drops = {3, 7}

    def verdict(topic: str, index: int, msgs: list) -> object:  # type: ignore[type-arg]
        # Count batches over the whole fake (index restarts per stream): drop twice mid-run.
        n = len(server.servicer.batches)
        if n in drops:
            drops.discard(n)
            return grpc.StatusCode.UNAVAILABLE
        return None

    server.servicer.on_batch = verdict
    p = await client.producer("/default/t", max_batch_messages=100)
    payloads = [b"%d" % i for i in range(1000)]
    offsets = await p.send_batch(payloads)
    assert len(offsets) == 1000
    stored = stored_payloads(server.servicer, "/default/t")
    assert stored == payloads  # UNAVAILABLE before storing: re-sent in order, nothing lost or doubled
    assert server.servicer.opens == 3


async def test_lost_ack_means_at_least_once(server: FakeServer, client: Client) -> None:
    lost = [True]

    def verdict(topic: str, index: int, msgs: list) -> object:  # type: ignore[type-arg]
        if lost[0] and index == 1:
            lost[0] = False
            return "store-then-drop"
        return None

    server.servicer.on_batch = verdict
    p = await client.producer("/default/t", max_batch_messages=10)
    offsets = await p.send_batch([b"%d" % i for i in range(30)])
    stored = stored_payloads(server.servicer, "/default/t")
    assert len(stored) == 40  # the batch whose ack was lost is stored twice
    assert sorted(set(stored)) == sorted({b"%d" % i for i in range(30)})
    assert [stored[o] for o in offsets] == [b"%d" % i for i in range(30)]


async def test_broker_restart_is_survived(server: FakeServer, client: Client) -> None:
    p = await client.producer("/default/t", linger_ms=1)
    first = await p.send_batch([b"a"] * 10)
    restart = asyncio.create_task(server.restart(down_for=0.3))
    sends = [p.send_nowait(b"b") for _ in range(100)]
    await restart
    offsets = await asyncio.gather(*sends)
    assert len(set(offsets)) == 100
    stored = stored_payloads(server.servicer, "/default/t")
    assert all(stored[o] == b"b" for o in offsets) and first == list(range(10))


async def test_retries_exhausted_raise_unavailable(server: FakeServer) -> None:
    async with Client(
        server.url, connect_timeout=0.3, max_retries=2, backoff_base=0.01, backoff_max=0.02
    ) as c:
        p = await c.producer("/default/t")
        await p.send(b"ok")
        await server.stop()
        with pytest.raises(errors.Unavailable):
            await p.send(b"lost")
        await server.start()
        assert await p.send(b"again") == 1  # new work after a failure tries again


async def test_open_errors_are_typed(server: FakeServer, client: Client) -> None:
    with pytest.raises(errors.NotFound, match="namespace"):
        await client.producer("/nope/t")
    with pytest.raises(errors.InvalidArgument):
        await client.producer("no-slash")
    with pytest.raises(errors.InvalidArgument):
        await client.producer("/default/bad name")


async def test_oversize_and_bad_payloads_rejected_locally(server: FakeServer, client: Client) -> None:
    p = await client.producer("/default/t", max_batch_bytes=4096)
    with pytest.raises(errors.InvalidArgument):
        await p.send(b"x" * 5000)
    with pytest.raises(errors.InvalidArgument):
        await p.send_batch([b"small", b"x" * 5000])
    with pytest.raises(TypeError):
        await p.send("text")  # type: ignore[arg-type]
    with pytest.raises(errors.InvalidArgument):
        await p.send(b"x", {f"k{i}": "v" for i in range(300)})
    assert await p.send(b"fine") == 0


async def test_bounded_buffer(server: FakeServer, client: Client) -> None:
    server.servicer.ack_delay = 0.05
    p = await client.producer("/default/t", max_buffered_messages=10, linger_ms=0)
    futs = [p.send_nowait(b"x") for _ in range(10)]
    with pytest.raises(errors.ResourceExhausted):
        p.send_nowait(b"x")
    assert await p.send(b"y") == 10  # waits for room instead
    await asyncio.gather(*futs)
    assert len(await p.send_batch([b"z"] * 100)) == 100  # larger than the buffer: fed as room appears


async def test_send_each_keeps_per_message_attributes_and_call_order(
    server: FakeServer, client: Client
) -> None:
    """Two calls queued back to back with a buffer smaller than either: the second waits behind the first
    (its messages get the later offsets) and every message keeps its own attributes and key."""
    server.servicer.ack_delay = 0.01
    p = await client.producer("/default/t", max_buffered_messages=40, max_batch_messages=25)
    first = [(b"a%d" % i, {"n": str(i)}, f"k{i % 3}") for i in range(100)]
    second = [(b"b%d" % i, {"n": str(i)}, None) for i in range(100)]
    a, b = await asyncio.gather(p.send_each(first), p.send_each(second))
    assert a == list(range(100)) and b == list(range(100, 200))
    stored = stored_messages(server.servicer, "/default/t")
    assert [m.payload for m in stored] == [m for m, _, _ in first + second]
    assert [m.attributes["n"] for m in stored] == [str(i) for i in range(100)] * 2
    assert [m.routing_key for m in stored[:3]] == ["k0", "k1", "k2"] and stored[100].routing_key is None
    assert p.buffered == 0 and await p.send_each([]) == []


async def test_send_each_checks_every_message_before_sending_any(server: FakeServer, client: Client) -> None:
    p = await client.producer("/default/t")
    with pytest.raises(errors.InvalidArgument):
        await p.send_each([(b"ok", None, None), (b"bad", {f"k{i}": "v" for i in range(300)}, None)])
    with pytest.raises(TypeError):
        await p.send_each([(b"ok", None, None), ("text", None, None)])  # type: ignore[list-item]
    assert stored_payloads(server.servicer, "/default/t") == []
    assert p.buffered == 0
    assert await p.send(b"next") == 0


async def test_flush_and_close(server: FakeServer, client: Client) -> None:
    p = await client.producer("/default/t", linger_ms=10_000)
    futs = [p.send_nowait(b"x") for _ in range(5)]
    await p.flush()
    assert all(f.done() for f in futs)
    fut = p.send_nowait(b"last")
    await p.close()
    assert fut.result() == 5
    with pytest.raises(errors.FailedPrecondition):
        await p.send(b"after close")


async def test_partitions_created_and_routed(server: FakeServer, client: Client) -> None:
    p = await client.producer("/default/pt", partitions=3, max_batch_messages=10)
    assert p.partitions == [f"/default/pt-part-{i}" for i in range(3)]
    await p.send_batch([b"u"] * 30)  # three full batches: one per partition
    for part in p.partitions:
        assert stored_payloads(server.servicer, part) == [b"u"] * 10
    for key in ("alpha", "beta", "gamma", "delta"):
        await p.send(key.encode(), key=key)
        part = p.partitions[fnv1a_64(key) % 3]
        assert stored_payloads(server.servicer, part)[-1] == key.encode()
    # A second producer finds the partitions by lookup.
    p2 = await client.producer("/default/pt")
    assert p2.partitions == p.partitions


async def test_producer_id_change_reencodes(server: FakeServer, client: Client) -> None:
    p = await client.producer("/default/t", "same", linger_ms=1)
    await p.send(b"1")
    server.servicer.producer_ids[("/default/t", "same")] = 999  # the broker hands out a new id
    await server.restart()
    await until(lambda: server.servicer.opens >= 1, "the stream opened")
    assert await p.send(b"2") == 1  # the fake asserts records carry the id of PublishOpened
