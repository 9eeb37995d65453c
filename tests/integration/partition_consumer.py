"""One consumer of a partitioned subscription as its own process (tests/integration/partition_scenario.py).

usage: python -m tests.integration.partition_consumer --client danube|ister --url URL --topic T
       --subscription S --name N [--ack-delay SECONDS]

`danube`: the official client, Failover (one consumer per partition, all named N). `ister`: Ister's client,
subscription type `partitioned`. Payloads are `key:seq`. Prints `READY` once subscribed, then one line per
message received, `<time.time()> <partition> <key> <seq>`, flushed at once (so what a SIGKILLed consumer
printed is still read by its parent). Each message is acknowledged `--ack-delay` seconds after it arrived
(its processing time). A line `stop` on stdin is a clean leave: nothing more is recorded, every recorded
message is acknowledged at once, the consumer closes, `CLOSED` is printed and the process exits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

PART_MARK = "-part-"


def emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Acker:
    """Acknowledges each message `delay` seconds after it arrived, in arrival order, each ack its own task
    (the official client's acks are unary calls; one at a time they would fall behind). `flush` acks the
    rest at once and waits for every ack to be answered."""

    def __init__(self, delay: float, ack: Callable[[Any], Awaitable[None]]) -> None:
        self.delay = delay
        self.ack = ack
        self.due: deque[tuple[float, Any]] = deque()
        self.wake = asyncio.Event()
        self.flushing = False
        self.sending: set[asyncio.Task[None]] = set()
        self.task = asyncio.create_task(self._run())

    def add(self, message: Any) -> None:
        self.due.append((time.monotonic() + self.delay, message))
        self.wake.set()

    async def _run(self) -> None:
        while True:
            if not self.due:
                if self.flushing:
                    return
                self.wake.clear()
                await self.wake.wait()
                continue
            at, message = self.due[0]
            wait = at - time.monotonic()
            if wait > 0 and not self.flushing:
                self.wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), wait)  # the message's processing time
                continue
            self.due.popleft()
            task = asyncio.create_task(self.ack(message))
            self.sending.add(task)
            task.add_done_callback(self.sending.discard)

    async def flush(self) -> None:
        self.flushing = True
        self.wake.set()
        await self.task
        await asyncio.gather(*self.sending)


def record(topic: str, payload: bytes) -> None:
    key, seq = payload.decode().split(":")
    emit(f"{time.time():.6f} {int(topic.rsplit(PART_MARK, 1)[1])} {key} {seq}")


async def wait_stop() -> None:
    while True:
        line = await asyncio.to_thread(sys.stdin.readline)
        if not line or line.strip() == "stop":
            return


async def run_danube(args: argparse.Namespace) -> None:
    import danube

    client = await danube.DanubeClientBuilder().service_url(args.url).build()
    cons = (
        client.new_consumer()
        .with_topic(args.topic)
        .with_consumer_name(args.name)
        .with_subscription(args.subscription)
        .with_subscription_type(danube.SubType.FAILOVER)
        .build()
    )
    await cons.subscribe()
    queue = await cons.receive()
    acker = Acker(args.ack_delay, cons.ack)
    emit("READY")

    async def receive() -> None:
        while True:
            m = await queue.get()
            record(m.msg_id.topic_name, bytes(m.payload))
            acker.add(m)

    receiving = asyncio.create_task(receive())
    await wait_stop()
    receiving.cancel()
    await acker.flush()
    await cons.close()


async def run_ister(args: argparse.Namespace) -> None:
    from ister.client import Client

    async with Client(args.url) as client:
        cons = await client.consumer(args.topic, args.subscription, name=args.name, type="partitioned")

        async def ack(m: Any) -> None:
            await m.ack()

        acker = Acker(args.ack_delay, ack)
        emit("READY")

        async def receive() -> None:
            async for m in cons:
                record(m.topic, m.payload)
                acker.add(m)

        receiving = asyncio.create_task(receive())
        await wait_stop()
        receiving.cancel()
        await acker.flush()
        await cons.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--client", choices=["danube", "ister"], required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--subscription", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--ack-delay", type=float, default=0.0)
    args = parser.parse_args()
    asyncio.run(run_danube(args) if args.client == "danube" else run_ister(args))
    emit("CLOSED")


if __name__ == "__main__":
    main()
