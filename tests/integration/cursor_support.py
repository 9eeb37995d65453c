"""Helpers of the cursor-reset and peek tests: publishing records with chosen publish times through the raw
batch API (the clients stamp the current time), and the admin CLI run as a subprocess."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import grpc
import msgspec

from ister.wire.gen import ister_v1_pb2 as pb
from ister.wire.gen import ister_v1_pb2_grpc as pb_grpc
from tests.integration.forkserver import run_ister

ISTER = [sys.executable, "-m", "ister.cli"]
_encode = msgspec.msgpack.Encoder().encode


async def publish_at(
    url: str, topic: str, times: list[int], name: str = "timed", first_seq: int = 1, batch: int = 1000
) -> int:
    """Publish one record per entry of `times` (payload `t<time>`), with that publish time (Unix ms), in
    batches of up to `batch`; returns the first offset."""
    target = url.removeprefix("http://")
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.IsterStub(channel)
        call = stub.Publish()
        open_ = pb.PublishOpen(topic=topic, producer_name=name, delivery=pb.RELIABLE)
        await call.write(pb.PublishRequest(open=open_))
        opened = await call.read()
        pid = opened.opened.producer_id
        first: int | None = None
        for seq, at in enumerate(range(0, len(times), batch), start=first_seq):
            chunk = times[at : at + batch]
            records = [[b"t%d" % t, t, pid, name, {}, None, None, None] for t in chunk]
            frame = pb.PublishBatch(sequence=seq, records=_encode(records), count=len(records))
            await call.write(pb.PublishRequest(batch=frame))
            ack = await call.read()
            if first is None:
                first = ack.ack.first_offset
        await call.done_writing()
        assert first is not None
        return first


async def cli(*args: str, within: float = 60) -> tuple[int, str, str]:
    done = await asyncio.to_thread(run_ister, list(args), timeout=within)
    return done.returncode, done.stdout, done.stderr


async def admin_json(admin_addr: str, *args: str) -> Any:
    code, out, err = await cli("admin", "topics", *args, "--admin-addr", admin_addr, "-o", "json")
    assert code == 0, (code, out, err)
    return json.loads(out)


async def admin_fails(admin_addr: str, *args: str, code: int = 1) -> str:
    got, out, err = await cli("admin", "topics", *args, "--admin-addr", admin_addr)
    assert got == code, (got, out, err)
    return err
