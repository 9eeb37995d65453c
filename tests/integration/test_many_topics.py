"""A broker process with many reliable topics (issue 14 item 2): its threads and file descriptors stay
bounded whatever the topic count, and the topic limit answers RESOURCE_EXHAUSTED with nothing written.
Counts are asserted, never times."""

from __future__ import annotations

import asyncio
import os
import urllib.request
from pathlib import Path

import pytest

from ister import errors
from ister.client import Client
from tests.integration.harness import BrokerProcess
from tests.support import until

TOPICS = 600
MAX_OPEN = 64


def proc_counts(pid: int) -> tuple[int, int]:
    """(threads, open file descriptors) of a process."""
    with open(f"/proc/{pid}/status") as f:
        threads = next(int(line.split()[1]) for line in f if line.startswith("Threads:"))
    return threads, len(os.listdir(f"/proc/{pid}/fd"))


def gauge(url: str, name: str) -> float:
    with urllib.request.urlopen(url, timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"{name} not exported")


@pytest.fixture
def broker(tmp_path: Path) -> BrokerProcess:
    proc = BrokerProcess(
        tmp_path / "data",
        env={
            "ISTER_WAL__IDLE_CLOSE_SECONDS": "1",
            "ISTER_WAL__MAX_OPEN_SEGMENTS": str(MAX_OPEN),
            "ISTER_LIMITS__MAX_TOPICS_PER_BROKER": str(TOPICS),
        },
    )
    proc.start()
    yield proc
    proc.stop()


async def test_many_topics_bounded_threads_and_descriptors_then_the_limit(broker: BrokerProcess) -> None:
    assert broker.proc is not None
    pid = broker.proc.pid
    _, fds_at_start = proc_counts(pid)
    most_threads = most_fds = 0
    async with Client(broker.url, retry_timeout=0) as client:
        next_topic = 0

        async def create() -> None:
            nonlocal next_topic, most_threads, most_fds
            while next_topic < TOPICS:
                name = f"/default/many-{next_topic}"
                next_topic += 1
                producer = await client.producer(name, "p", reliable=True, linger_ms=0)
                assert await producer.send(b"one") == 0
                await producer.close()
                threads, fds = proc_counts(pid)
                most_threads, most_fds = max(most_threads, threads), max(most_fds, fds)

        await asyncio.gather(*(create() for _ in range(16)))
        # one thread pool, not a thread per topic; at most MAX_OPEN segment files open, whatever the count
        assert most_threads <= 64
        assert most_fds <= fds_at_start + MAX_OPEN + 40  # + client connections, metadata, object store

        # idle: the segment files are closed again
        await until(
            lambda: gauge(broker.metrics_url, "ister_wal_open_segment_files") == 0, "idle closes", within=30
        )
        await until(
            lambda: proc_counts(pid)[1] <= fds_at_start + 20, "descriptors back near the start", within=30
        )

        # the limit: the next topic is refused before anything is written, the existing ones still work
        with pytest.raises(errors.ResourceExhausted, match="max_topics_per_broker"):
            await client.producer("/default/one-too-many", "p", reliable=True)
        with pytest.raises(errors.NotFound):
            await client.offsets("/default/one-too-many")
        assert not (broker.data_dir / "wal" / "default" / "one-too-many").exists()
        producer = await client.producer("/default/many-7", "p", reliable=True)
        assert await producer.send(b"two") == 1
        await producer.close()
