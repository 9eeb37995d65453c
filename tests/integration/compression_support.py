"""Helpers of the compression tests (docs/compression.md): realistic JSON log lines, a raw batch-API Read
that shows records as stored, and a Publish stream driven by hand for bad input."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc

from ister.benchmark.payloads import log_lines as log_lines  # re-exported for the tests
from ister.client import Client
from ister.core.compression import ENVELOPE, MARK, Codec
from ister.core.record import decode_message
from ister.wire.gen import ister_v1_pb2 as pb
from ister.wire.gen import ister_v1_pb2_grpc as pb_grpc

CODECS = ["none", "lz4", "zstd", "snappy", "gzip"]


async def stored_codecs(url: str, topic: str, start: int, end: int, accept: bool = True) -> list[int]:
    """The codec of every record in [start, end) as the broker sends it (Codec.NONE for a plain one)."""
    async with grpc.aio.insecure_channel(url.removeprefix("http://")) as channel:
        stub = pb_grpc.IsterStub(channel)
        request = pb.ReadRequest(topic=topic, start=start, end=end, accept_compressed=accept)
        codecs: list[int] = []
        async for batch in stub.Read(request, timeout=30):
            codecs += _codecs(batch.frames)
        return codecs


def _codecs(frames: bytes) -> list[int]:
    codecs, pos = [], 0
    while pos < len(frames):
        length = int.from_bytes(frames[pos + 8 : pos + 12], "little")
        record = frames[pos + 16 : pos + 16 + length]
        codecs.append(ENVELOPE.unpack_from(record)[1] if record[0] == MARK else Codec.NONE)
        pos += 16 + length
    return codecs


async def consumed_codecs(url: str, topic: str, subscription: str, n: int, accept: bool) -> list[int]:
    """The codec of each of the first `n` records a new Consume stream gets (from the earliest offset)."""
    async with grpc.aio.insecure_channel(url.removeprefix("http://")) as channel:
        call = pb_grpc.IsterStub(channel).Consume()
        opening = pb.ConsumeOpen(
            topic=topic,
            subscription=subscription,
            consumer_name="raw",
            initial_position=pb.EARLIEST,
            window=max(n, 100),  # all of them without acks
            accept_compressed=accept,
        )
        await call.write(pb.ConsumeRequest(open=opening))
        assert (await asyncio.wait_for(call.read(), 30)).HasField("opened")
        codecs: list[int] = []
        while len(codecs) < n:
            codecs += _codecs((await asyncio.wait_for(call.read(), 30)).batch.frames)
        call.cancel()
        return codecs


async def read_payloads(url: str, topic: str) -> list[bytes]:
    async with Client(url) as c:
        head = (await c.offsets(topic)).next
        out: list[bytes] = []
        async for batch in c.read(topic, 0, head):
            out.extend(decode_message(r).payload for _, r in batch)
        return out


async def publish_raw(
    url: str, topic: str, make: Callable[[int], pb.PublishBatch]
) -> tuple[grpc.StatusCode, str]:
    """One PublishBatch, `make(producer id)`, on a new stream of producer "raw": (status, details) the stream
    ends with, or (OK, "") when the batch was acknowledged."""
    async with grpc.aio.insecure_channel(url.removeprefix("http://")) as channel:
        call = pb_grpc.IsterStub(channel).Publish()
        opening = pb.PublishOpen(topic=topic, producer_name="raw", delivery=pb.RELIABLE)
        await call.write(pb.PublishRequest(open=opening))
        opened = await asyncio.wait_for(call.read(), 30)
        try:
            await call.write(pb.PublishRequest(batch=make(opened.opened.producer_id)))
            resp = await asyncio.wait_for(call.read(), 30)
        except grpc.aio.AioRpcError as exc:
            return exc.code(), exc.details() or ""
        if resp is not grpc.aio.EOF:
            call.cancel()
            return grpc.StatusCode.OK, ""
        return await call.code(), await call.details()
