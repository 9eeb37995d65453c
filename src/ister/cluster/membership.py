"""Broker identity, registration under a lease, the lease keep-alive loop and the fencing clock.

The fencing rule: a keep-alive sent at time t (monotonic) proves the lease lives until at least t + TTL on
the etcd side, so this broker may act as an owner until t + TTL - margin. Past that it refuses appends by
itself, before the leader can see the registration expire and hand its topics to someone else.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from ister.clock import REAL_CLOCK, Clock
from ister.config import BrokerConfig, http_url
from ister.core.cluster.planner import ACTIVE, BROKER_MODES
from ister.errors import ConfigError, MetadataError
from ister.ids import new_id
from ister.metadata import keys
from ister.metadata.store import LeaseNotFound, MetadataStore
from ister.tasks import TaskSupervisor

log = logging.getLogger(__name__)

BROKER_ID_FILE = "broker_id"
FENCE_MARGIN_SECONDS = 1.0  # covers clock-rate drift and one append in flight


def load_broker_id(data_dir: Path) -> int:
    """This broker's id, kept in the data dir so a restarted broker is the same broker (same topics)."""
    path = data_dir / BROKER_ID_FILE
    if path.exists():
        text = path.read_text().strip()
        if not text.isdigit() or not 0 < int(text) < 2**64:
            raise ConfigError(f"{path} does not hold a broker id (a positive integer): {text[:40]!r}")
        return int(text)
    broker_id = new_id() >> 1  # stays a positive signed 64-bit integer for every JSON consumer
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{broker_id}\n")
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    tmp.replace(path)
    return broker_id


class LeaseClock:
    """Until when this broker may act as an owner (monotonic seconds)."""

    def __init__(self, clock: Clock = REAL_CLOCK) -> None:
        self.valid_until = 0.0
        self.time = clock

    def valid(self) -> bool:
        return self.time.monotonic() < self.valid_until

    def renewed(self, sent_at: float, ttl: float) -> None:
        self.valid_until = max(self.valid_until, sent_at + ttl - FENCE_MARGIN_SECONDS)

    def expire(self) -> None:
        self.valid_until = 0.0


class Membership:
    """Registers the broker, keeps its lease alive and tells the node when the lease is lost."""

    def __init__(
        self,
        config: BrokerConfig,
        store: MetadataStore,
        broker_id: int,
        on_lease_lost: Callable[[], Awaitable[None]],
        clock: Clock = REAL_CLOCK,
    ) -> None:
        self.config = config
        self.store = store
        self.broker_id = broker_id
        self.ttl = config.cluster.lease_ttl_seconds
        self.time = clock  # what the keep-alive waits on and the lease is timed by
        self.clock = LeaseClock(clock)
        self.lease_id: int | None = None
        self._on_lease_lost = on_lease_lost
        self._tasks = TaskSupervisor("cluster membership")  # the lease keep-alive

    def registration(self) -> dict[str, Any]:
        url = self.config.broker_url
        value: dict[str, Any] = {
            # Danube v0.15 field names, then the older layout's (docs/metadata.md, `/cluster/register`),
            # so tools of either era can read it.
            "broker_url": url,
            "connect_url": url,
            "admin_addr": http_url(self.config.admin_addr),
            "broker_addr": url,
            "advertised_addr": url.split("://", 1)[-1],
        }
        if self.config.prom_exporter:
            value["prom_exporter"] = self.config.prom_exporter
        if self.config.cluster.zone:
            value["zone"] = self.config.cluster.zone  # Ister: replica placement spreads over zones
        return value

    async def register(self) -> None:
        """A fresh lease, the registration under it, and the broker state (kept across restarts)."""
        sent = self.time.monotonic()
        lease = await self.store.grant_lease(self.ttl)
        await self.store.put(keys.broker_register(self.broker_id), self.registration(), lease=lease)
        await self.store.delete(keys.absent_broker(self.broker_id))  # back: its replicas' clock stops
        self.lease_id = lease
        self.clock.renewed(sent, self.ttl)
        state_key = keys.broker_state(self.broker_id)
        state = await self.store.get(state_key)
        mode = state.value.get("mode") if state is not None and isinstance(state.value, dict) else None
        if mode not in BROKER_MODES:
            await self.store.put(state_key, {"mode": ACTIVE, "reason": "boot"})
        log.info("registered broker %d (lease %x, ttl %d s, state %s)", self.broker_id, lease, self.ttl, mode)

    def start(self) -> None:
        self._tasks.spawn(self._keep_alive_loop(), "lease keep-alive")

    async def _keep_alive_loop(self) -> None:
        interval = self.ttl / 5
        while True:
            await self.time.sleep(interval)
            sent = self.time.monotonic()
            try:
                if self.lease_id is None:
                    await self.register()
                    continue
                async with self.time.timeout(interval * 2):
                    await self.store.keep_alive(self.lease_id)
                self.clock.renewed(sent, self.ttl)
            except LeaseNotFound:
                log.warning(
                    "broker %d lost its lease: releasing its topics, registering again", self.broker_id
                )
                self.clock.expire()
                self.lease_id = None
                await self._on_lease_lost()
            except (MetadataError, TimeoutError) as exc:
                left = self.clock.valid_until - self.time.monotonic()
                log.warning("lease keep-alive failed (%s); owner rights for %.1f s more", exc, max(left, 0.0))

    async def close(self) -> None:
        """Stop renewing and revoke the lease: the registration goes at once, so failover starts now."""
        await self._tasks.close()
        self.clock.expire()
        if self.lease_id is not None:
            with contextlib.suppress(MetadataError, TimeoutError):
                async with asyncio.timeout(2.0):
                    await self.store.revoke_lease(self.lease_id)
            self.lease_id = None
