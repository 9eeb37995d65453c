"""The reliable dispatch loop's one timer (ReliableSubscription._arm_timer): armed for the heartbeat and
kept while it fires soon enough, but moved earlier when a redelivery falls due before it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ister.broker import reliable
from ister.broker.sessions import ConsumerStream, OutChunk
from ister.clock import VirtualClock
from ister.core.dispatch import FailurePolicy
from ister.core.record import StoredMessage, encode_message
from ister.storage.wal import Wal, WalConfig
from tests.unit.test_catchup_runs import started_subscription


async def next_offsets(stream: ConsumerStream) -> list[int]:
    item = await stream.get()
    assert item is not None
    return list(item.offsets) if isinstance(item, OutChunk) else [item.offset]


async def test_a_short_nack_delay_is_served_before_a_far_heartbeat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reliable, "HEARTBEAT_SECONDS", 60.0)  # the armed timer fires in a minute
    wal = await Wal.open(tmp_path, WalConfig())
    message = StoredMessage(payload=b"m", publish_time=1, producer_id=1, producer_name="p")
    await wal.append([encode_message(message)])

    clock = VirtualClock()
    sub, stream, _ = started_subscription(wal, wal.reader(0), window=10, stream_size=100, clock=clock)
    try:
        async with asyncio.timeout(10):
            # Delivered: the loop went back to sleep with its minute-long timer armed.
            assert await next_offsets(stream) == [0]
            assert await sub.nack(0, 100, "later")
            await clock.advance(FailurePolicy().retry_delay_ms(1, 100) / 1000)  # its redelivery delay passes
            # Redelivered once its delay passed, long before the heartbeat: the timer was moved earlier.
            assert await next_offsets(stream) == [0]
    finally:
        await sub.close()
        await wal.close()
