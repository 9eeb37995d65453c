"""Admin unload on a standalone broker: the topic is sealed and released, then served again from its sealed
state; clients of the official danube-client continue, offsets stay dense, across a restart too."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

from tests.integration.harness import BrokerProcess, client, consumer, producer

ISTER = [sys.executable, "-m", "ister.cli"]
WAIT = 20.0


def admin(broker: BrokerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ISTER, "admin", *args, "--admin-addr", broker.admin_addr],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_unload_then_restart_keeps_offsets_and_clients(fresh_broker: BrokerProcess, topic: str) -> None:
    c = await client(fresh_broker.url)
    p = await producer(c, topic, "p", reliable=True)
    cons, queue = await consumer(c, topic, "c", "s")
    got: list[tuple[int, bytes]] = []

    async def send_and_receive(start: int, count: int) -> None:
        for i in range(start, start + count):
            await p.send(f"m{i}".encode(), {})
        while len({payload for _, payload in got}) < start + count:
            msg = await asyncio.wait_for(queue.get(), WAIT)
            got.append((msg.msg_id.topic_offset, msg.payload))
            await cons.ack(msg)

    await send_and_receive(0, 10)
    done = admin(fresh_broker, "topics", "unload", topic)
    assert done.returncode == 0, done.stderr
    await send_and_receive(10, 10)
    fresh_broker.terminate()
    fresh_broker.start()
    await send_and_receive(20, 10)
    first = {payload: offset for offset, payload in reversed(got)}  # first delivery of each message
    assert sorted(first.values()) == list(range(30))
    assert first[b"m0"] == 0 and first[b"m29"] == 29
    described = admin(fresh_broker, "topics", "describe", topic, "--output", "json")
    assert described.returncode == 0, described.stderr
    assert "s" in json.dumps(json.loads(described.stdout))
    missing = admin(fresh_broker, "topics", "unload", "/default/does_not_exist")
    assert missing.returncode == 1 and "does not exist" in missing.stderr
    await cons.close()
