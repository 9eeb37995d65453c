"""`OwnershipGuard`: what a loaded topic consults before every append and cursor write in cluster mode."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from ister.cluster.membership import LeaseClock
from ister.core.cluster.ownership import OwnerRecord, extend, needs_extension
from ister.errors import Fenced, MetadataError
from ister.metadata import keys
from ister.metadata.store import Compare, MetadataStore, Put

if TYPE_CHECKING:
    from ister.ports.claim import ReplicationGate
    from ister.storage.wal import Wal

log = logging.getLogger(__name__)


class OwnershipGuard:
    def __init__(
        self,
        topic: str,
        store: MetadataStore,
        clock: LeaseClock,
        record: OwnerRecord,
        version: int,
        reservation: int,
    ) -> None:
        self.topic = topic
        self.key = keys.owner(topic)
        self.store = store
        self.clock = clock
        self.record = record
        self.version = version  # of the owner record as last written by us
        self.reservation = reservation
        self.revoked: str | None = None
        self.wal: Wal | None = None
        self._extending: asyncio.Task[None] | None = None
        self.replication: ReplicationGate | None = None  # set when the topic is replicated

    @property
    def epoch(self) -> int:
        return self.record.epoch

    def bind(self, wal: Wal | None) -> None:
        self.wal = wal
        if wal is not None:
            wal.limit_offsets(self.record.reserved_until)

    def check(self, count: int = 1) -> None:
        """Raise Fenced unless this broker may append `count` records now.

        Also (re)starts the reservation extension when it is due: a failed attempt is retried by the next
        publish, and a batch larger than what is left gets a reservation that covers it.
        """
        if self.revoked is not None:
            raise Fenced(f"topic {self.topic} is no longer served here ({self.revoked}); redo the lookup")
        if not self.clock.valid():
            raise Fenced(f"topic {self.topic}: this broker cannot renew its lease; redo the lookup")
        self._maybe_extend(count)

    def revoke(self, reason: str) -> None:
        if self.revoked is None:
            self.revoked = reason
            log.info("ownership of %s (epoch %d) revoked: %s", self.topic, self.epoch, reason)
        if self.wal is not None:
            self.wal.limit_offsets(self.wal.next_offset)  # nothing more gets an offset here

    def appended(self) -> None:
        """Take the next offset reservation in the background once half of the current one is used."""
        self._maybe_extend(0)

    def _maybe_extend(self, pending: int) -> None:
        wal = self.wal
        if wal is None or self._extending is not None or self.revoked is not None:
            return
        upto = wal.next_offset + pending
        if not needs_extension(self.record, upto, self.reservation):
            return
        self._extending = asyncio.get_running_loop().create_task(self._extend(upto))

    async def _extend(self, next_offset: int) -> None:
        try:
            new = extend(self.record, next_offset, self.reservation)
            ok = await self.store.txn([Compare(self.key, self.version)], [Put(self.key, new.to_json())])
            if not ok:
                self.revoke("the owner record changed (reassigned)")
                return
            kv = await self.store.get(self.key)
            if kv is None or OwnerRecord.parse(kv.value) != new:
                self.revoke("the owner record changed (reassigned)")
                return
            self.record, self.version = new, kv.version
            if self.wal is not None and self.revoked is None:
                self.wal.limit_offsets(new.reserved_until)
        except MetadataError as exc:
            log.warning(
                "%s: extending the offset reservation failed (%s); the next publish retries", self.topic, exc
            )
        finally:
            self._extending = None

    async def guarded_put(self, key: str, value: object) -> None:
        """A metadata write that lands only while this broker still owns the topic (cursor flushes)."""
        self.check()
        if not await self.store.txn([Compare(self.key, self.version)], [Put(key, value)]):
            kv = await self.store.get(self.key)
            record = OwnerRecord.parse(kv.value) if kv is not None else None
            if record is None or record.epoch != self.epoch or record.broker_id != self.record.broker_id:
                self.revoke("the owner record changed (reassigned)")
                raise Fenced(f"topic {self.topic} was reassigned; write to {key} refused")
            # Our own reservation update raced this write: adopt the version and retry once.
            self.version = kv.version if kv is not None else self.version
            if not await self.store.txn([Compare(self.key, self.version)], [Put(key, value)]):
                raise Fenced(f"topic {self.topic}: owner record changed during a write to {key}")
