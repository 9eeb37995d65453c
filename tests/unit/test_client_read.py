"""`Client.read` / `Client.offsets` and their blocking versions against a FAKE broker that serves Read
from a dict of records and fails streams exactly where a test says (see test_client_support for why fakes).
The real broker side is tests/unit/test_batch_read.py and tests/integration/test_batch_read.py."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest

from ister import errors
from ister.client import Client, TopicOffsets
from ister.client.blocking import BlockingClient
from ister.core.frames import encode_frame
from ister.wire.gen import ister_v1_pb2 as pb
from ister.wire.gen import ister_v1_pb2_grpc as pb_grpc
from tests.unit.test_client_support import FakeServer

TOPIC = "/default/t"
# Offsets 0..19 and 25..39 (a gap of five), each record a few distinct bytes.
RECORDS = {o: b"record-%d" % o for o in [*range(20), *range(25, 40)]}


class FakeReads(pb_grpc.IsterServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self.requests: list[tuple[int, int, int]] = []  # (start, end, max_records) per Read call
        self.fail_after: list[int] = []  # per call, in order: batches to send before UNAVAILABLE
        self.always_fail = False
        self.repeat_first = False  # misbehave: send a batch's first record twice

    async def Lookup(self, request: Any, context: Any) -> Any:
        return pb.LookupResponse(partitions=[request.topic], broker_url="")

    async def Offsets(self, request: Any, context: Any) -> Any:
        if request.topic != TOPIC:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"topic {request.topic} does not exist")
        return pb.OffsetsResponse(earliest=0, next=40, durable_url="", object_prefix="")

    async def Read(self, request: Any, context: Any) -> AsyncIterator[Any]:
        self.requests.append((request.start, request.end, request.max_records))
        limit = 0 if self.always_fail else (self.fail_after.pop(0) if self.fail_after else None)
        offsets = [o for o in sorted(RECORDS) if request.start <= o < request.end]
        n = request.max_records
        for i, at in enumerate(range(0, len(offsets), n)):
            if i == limit:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "topic moved; redo the lookup")
            chunk = offsets[at : at + n]
            if self.repeat_first:
                chunk = [chunk[0], *chunk]
            frames = b"".join(encode_frame(o, RECORDS[o]) for o in chunk)
            yield pb.MessageBatch(frames=frames, count=len(chunk))


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeReads, FakeServer]]:
    servicer = FakeReads()
    server = FakeServer(servicer)  # type: ignore[arg-type]
    await server.start()
    yield servicer, server
    await server.stop()


def fast_client(url: str) -> Client:
    return Client(url, max_retries=3, backoff_base=0.001, backoff_max=0.01)


async def collect(client: Client, start: int, end: int, max_records: int) -> list[list[tuple[int, bytes]]]:
    async with asyncio.timeout(20):
        return [b async for b in client.read(TOPIC, start, end, max_records=max_records)]


async def test_read_resumes_after_the_last_offset_yielded(fake: tuple[FakeReads, FakeServer]) -> None:
    servicer, server = fake
    servicer.fail_after = [1, 0, 2]  # fail after 1 batch, at once, after 2 batches; then succeed
    async with fast_client(server.url) as client:
        batches = await collect(client, 0, 40, 5)
    assert [r for b in batches for r in b] == sorted(RECORDS.items())
    assert all(len(b) <= 5 for b in batches)
    assert [(s, e) for s, e, _ in servicer.requests] == [(0, 40), (5, 40), (5, 40), (15, 40)]
    assert {m for _, _, m in servicer.requests} == {5}


async def test_read_range_is_end_exclusive_and_absent_offsets_are_skipped(
    fake: tuple[FakeReads, FakeServer],
) -> None:
    servicer, server = fake
    async with fast_client(server.url) as client:
        got = [o for b in await collect(client, 18, 27, 100) for o, _ in b]
        assert got == [18, 19, 25, 26]
        assert await collect(client, 21, 21, 100) == []
    assert [(s, e) for s, e, _ in servicer.requests] == [(18, 27)]  # an empty range sends nothing


async def test_read_gives_up_after_max_retries(fake: tuple[FakeReads, FakeServer]) -> None:
    servicer, server = fake
    servicer.always_fail = True
    async with fast_client(server.url) as client:
        with pytest.raises(errors.Unavailable, match="topic moved"):
            await collect(client, 0, 40, 5)
    assert len(servicer.requests) == 4  # the first attempt and max_retries=3 more


async def test_read_refuses_repeated_offsets(fake: tuple[FakeReads, FakeServer]) -> None:
    servicer, server = fake
    servicer.repeat_first = True
    async with fast_client(server.url) as client:
        with pytest.raises(errors.CorruptionError, match="out of order"):
            await collect(client, 0, 40, 5)


async def test_offsets(fake: tuple[FakeReads, FakeServer]) -> None:
    _, server = fake
    async with fast_client(server.url) as client:
        assert await client.offsets(TOPIC) == TopicOffsets(TOPIC, 0, 40, None, "")
        with pytest.raises(errors.NotFound):
            await client.offsets("/default/other")


@pytest.fixture
def threaded() -> Iterator[tuple[FakeReads, FakeServer]]:
    """The fake broker on its own thread's loop, as the blocking client needs."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    servicer = FakeReads()
    server = FakeServer(servicer)  # type: ignore[arg-type]
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(10)
    yield servicer, server
    asyncio.run_coroutine_threadsafe(server.stop(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def test_blocking_read_and_offsets(threaded: tuple[FakeReads, FakeServer]) -> None:
    servicer, server = threaded
    servicer.fail_after = [2]
    with BlockingClient(server.url, max_retries=3, backoff_base=0.001) as client:
        assert client.offsets(TOPIC) == TopicOffsets(TOPIC, 0, 40, None, "")
        batches = list(client.read(TOPIC, 0, 40, max_records=7))
        assert [r for b in batches for r in b] == sorted(RECORDS.items())
        assert [s for s, _, _ in servicer.requests] == [0, 14]
        # Leaving the iteration early ends the read; the client stays usable.
        reader = client.read(TOPIC, 0, 40, max_records=2)
        assert next(reader) == [(0, RECORDS[0]), (1, RECORDS[1])]
        reader.close()
        assert [o for b in client.read(TOPIC, 38, 100) for o, _ in b] == [38, 39]
        with pytest.raises(errors.InvalidArgument):
            list(client.read(TOPIC, 5, 4))
        with pytest.raises(errors.NotFound):
            client.offsets("/default/other")
