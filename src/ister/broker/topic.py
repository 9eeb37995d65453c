"""A loaded topic: its producers, its subscriptions and, when reliable, its WAL."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Sequence
from time import monotonic
from typing import TYPE_CHECKING

import msgspec

from ister.broker import deadlines, metrics
from ister.broker.nonreliable import NonReliableSubscription
from ister.broker.reliable import ReliableSubscription
from ister.broker.sessions import ProducerSession
from ister.broker.subscription import Subscription
from ister.core.lifecycle import TopicLifecycle
from ister.core.missing_offsets import GapLedger
from ister.core.record import StoredMessage, encode_message
from ister.errors import DiskFull, InvalidArgument, QuotaExceeded, Timeout, Unavailable
from ister.ids import TopicName
from ister.limits import PUBLISH_TIMEOUT_SECONDS
from ister.storage.wal import Wal

if TYPE_CHECKING:
    from ister.broker.compression_policy import TopicCompressionPolicy
    from ister.broker.dedup import TopicDedup
    from ister.broker.rate_limits import TopicLimits
    from ister.ports.claim import TopicClaim
    from ister.storage.diskspace import DiskSpace
    from ister.storage.objects import SegmentExporter

log = logging.getLogger(__name__)

RELIABLE = "Reliable"
NON_RELIABLE = "NonReliable"


class Topic:
    def __init__(
        self,
        name: TopicName,
        *,
        delivery: str,
        max_message_size: int,
        wal: Wal | None,
        claim: TopicClaim,
        lifecycle: TopicLifecycle,
        space: DiskSpace | None = None,
    ) -> None:
        if (delivery == RELIABLE) != (wal is not None):
            raise ValueError("a reliable topic needs a WAL and a non-reliable one must not have one")
        self.name = name
        self.delivery = delivery
        self.max_message_size = max_message_size
        self.wal = wal
        self.dedup: TopicDedup | None = None  # idempotent producers (reliable topics; set by the registry)
        self.producers: dict[int, ProducerSession] = {}
        self.subscriptions: dict[str, Subscription] = {}
        # Its owner's (broker/topic_owner.py): storage is open and the claim committed when a Topic is built;
        # it serves once the owner saw it CLAIMED.
        self.lifecycle = lifecycle
        self.space = space  # the data disk's free space: reliable publishes stop below its headroom
        self.claim = claim  # fences appends and owner-only metadata writes (a stale owner's land nowhere)
        self.exporter: SegmentExporter | None = None  # durable tier: exports closed WAL segments
        self.tasks: list[asyncio.Task[None]] = []  # background work that ends with the topic
        self.messages_in = 0
        self.bytes_in = 0
        self.lock = asyncio.Lock()  # serialises subscription changes, which await metadata writes
        self._next_volatile_offset = 0  # non-reliable topics number messages in memory only
        self._m_in = metrics.messages_in.labels(name.full)
        self._m_bytes = metrics.bytes_in.labels(name.full)
        # Named cursors moved by readers that keep their own position (SetCursor, e.g. Spark's source):
        # subscription -> next offset. Their lag is published like a subscription's, kept fresh per append.
        self.cursors: dict[str, int] = {}
        self._cursor_gauges: dict[str, metrics.Child] = {}  # their lag series, looked up once, not per append
        self.gaps = GapLedger()  # offsets readers found missing: counted and logged once each
        # Reliable: the lowest offset retention keeps (broker/retention.py); readers start at or above it.
        self.start_offset = 0
        # Why publishes are refused or held: the slowest subscription is past the backlog quota
        self.quota_breach: str | None = None
        self.limits: TopicLimits | None = None  # its publish and dispatch rate limits (broker/rate_limits.py)
        # the codec plain records are stored with (broker/compression_policy.py); None: always plain
        self.compression: TopicCompressionPolicy | None = None
        self._quota_policy = "producer_error"
        self._quota_hold_s = 0.0
        self._quota_cleared: asyncio.Event | None = None
        self._publish_deadlines = deadlines.shared(PUBLISH_TIMEOUT_SECONDS)  # one timer for all topics
        if wal is not None:
            wal.on_committed = self._wake_subscriptions

    def _wake_subscriptions(self) -> None:
        """Readers of the WAL can see more records (committed, and on a replicated topic also on enough
        replicas): subscriptions deliver them at once rather than after the publish path resumes."""
        for sub in self.subscriptions.values():
            if isinstance(sub, ReliableSubscription):
                sub.notify()

    def report_gap(self, first: int, end: int) -> None:
        """A reader skipped offsets [first, end): they exist nowhere it could read (docs/architecture.md
        §12, "Gaps never wedge")."""
        for a, b in self.gaps.add(first, end):
            metrics.offsets_skipped.labels(self.name.full).inc(b - a)
            log.warning(
                "%s: offsets %d..%d exist in neither the durable tier nor the WAL; readers skip them "
                "(records that turn up there later reach subscriptions that have not passed them)",
                self.name,
                a,
                b - 1,
            )

    @property
    def closing(self) -> bool:
        """Appends are refused (sealing for a move, fenced, closed)."""
        return not self.lifecycle.accepts_appends

    @property
    def reliable(self) -> bool:
        return self.wal is not None

    @property
    def volatile_next(self) -> int:
        """A non-reliable topic's next offset (numbered in memory since it loaded)."""
        return self._next_volatile_offset

    def producer_by_name(self, name: str) -> ProducerSession | None:
        for p in self.producers.values():
            if p.name == name:
                return p
        return None

    def set_quota_breach(self, why: str | None, policy: str, hold_seconds: float = 0.0) -> None:
        """Set by each retention pass: `why` the backlog is past the namespace's quota, or None."""
        self._quota_policy, self._quota_hold_s = policy, hold_seconds
        self.quota_breach = why
        if why is None and self._quota_cleared is not None:
            self._quota_cleared.set()
            self._quota_cleared = None

    async def _over_quota(self, why: str) -> None:
        """producer_error: refuse; producer_hold: wait (bounded) for the backlog to come back under the
        quota, then refuse; consumer_eviction: accept (retention makes room by moving the slowest on)."""
        policy = self._quota_policy
        if policy == "consumer_eviction":
            return
        if policy == "producer_hold" and self._quota_hold_s > 0:
            if self._quota_cleared is None:
                self._quota_cleared = asyncio.Event()
            cleared = self._quota_cleared
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._quota_hold_s):
                    await cleared.wait()
                    return
            why = f"{why} (publish held {self._quota_hold_s:g} s)"
        metrics.quota_refusals.inc()
        raise QuotaExceeded(f"{self.name}: {why}")

    async def admit(self, messages: int, nbytes: int) -> None:
        """The admission point of a publish, before it is accepted: waits for the topic's publish rate
        limit (back-pressure), or raises ResourceExhausted when the wait would be too long."""
        limits = self.limits
        if limits is not None:
            await limits.admit_publish(messages, nbytes)

    def check_size(self, size: int) -> None:
        if self.max_message_size and size > self.max_message_size:
            raise InvalidArgument(
                f"message of {size} bytes exceeds max_message_size {self.max_message_size} of {self.name}"
            )

    async def publish(self, message: StoredMessage) -> int:
        """Store (reliable: durable before return) and dispatch one message; returns its offset."""
        self.check_size(len(message.payload))
        return await self.publish_batch([encode_message(message)], [message], len(message.payload))

    async def publish_batch(
        self,
        records: Sequence[bytes | msgspec.Raw],
        messages: Sequence[StoredMessage],
        payload_bytes: int,
        on_offset: Callable[[int], None] | None = None,
    ) -> int:
        """Store and dispatch validated messages (`records[i]` is the encoded `messages[i]`) in order.

        Reliable topics return only once every record is durable; returns the first offset. The offsets are
        assigned before the first suspension point, so concurrent calls keep their call order.
        """
        if not self.lifecycle.accepts_appends:
            raise Unavailable(f"topic {self.name} is {self.lifecycle.state}; redo the lookup")
        if self.quota_breach is not None:
            await self._over_quota(self.quota_breach)
        claim = self.claim
        claim.check(len(records))
        gate = claim.replication
        if gate is not None:
            gate.check_writable()
        space = self.space
        if space is not None and self.wal is not None:
            refusal = space.take(payload_bytes)  # below the data disk's headroom: refused, nothing written
            if refusal is not None:
                metrics.publishes_refused.labels("disk_full").inc(len(records))
                raise DiskFull(refusal)
        self._m_in.inc(len(records))
        self._m_bytes.inc(payload_bytes)
        self.messages_in += len(records)  # cumulative, for load reports (rates are deltas of these)
        self.bytes_in += payload_bytes
        if self.wal is not None:
            records = self._stored_form(records)
            started = monotonic()
            try:
                with self._publish_deadlines.guard():
                    # msgspec.Raw is a buffer over the client's record bytes: framed without a copy
                    # on_offset once the WAL took the offsets: from then on the records are written even if
                    # this call times out, so an idempotent retry must not store them again
                    offset = await self.wal.append(records, assigned=on_offset)
                    done = monotonic()
                    metrics.publish_durable.observe(done - started)
                    claim.appended()
                    if gate is not None:
                        # acknowledged only once enough replicas hold it (readers see it from then on)
                        gate.appended()
                        await gate.wait_committed(offset + len(records))
                        done = monotonic()
                    metrics.publish_committed.observe(done - started)
                if self.cursors:
                    self._cursor_lag_changed()
            except DiskFull:  # the disk filled between two checks of its free space (storage/diskspace.py)
                metrics.publishes_refused.labels("disk_full").inc(len(records))
                if space is not None:
                    space.wake()
                raise
            except TimeoutError:
                where = "the WAL" if gate is None else "the WAL and its in-sync replicas"
                raise Timeout(
                    f"{self.name}: {where} did not make the message durable "
                    f"within {self._publish_deadlines.timeout:g} s"
                ) from None
            return offset  # the subscriptions were woken by the WAL when readers could see the records
        first = self._next_volatile_offset
        self._next_volatile_offset += len(records)
        subs = [s for s in self.subscriptions.values() if isinstance(s, NonReliableSubscription)]
        for i, (record, message) in enumerate(zip(records, messages, strict=True)):
            for sub in subs:
                sub.dispatch(first + i, message, record)
        return first

    def _stored_form(self, records: Sequence[bytes | msgspec.Raw]) -> Sequence[bytes | msgspec.Raw]:
        """The records as the WAL stores them: compressed with the topic's codec when it has one
        (docs/compression.md); as they are otherwise, without a copy."""
        policy = self.compression
        return records if policy is None else policy.stored_form(records)

    async def wait_committed(self, end: int) -> None:
        """Wait until offsets below `end` are committed (a replicated topic: on enough replicas)."""
        gate = self.claim.replication
        if gate is not None:
            try:
                with self._publish_deadlines.guard():
                    await gate.wait_committed(end)
            except TimeoutError:
                raise Timeout(f"{self.name}: the in-sync replicas did not commit offset {end - 1}") from None

    def reliable_subscriptions(self) -> Iterable[ReliableSubscription]:
        return (s for s in self.subscriptions.values() if isinstance(s, ReliableSubscription))

    def backlog(self) -> int:
        """Messages not yet consumed, summed over the reliable subscriptions and the named cursors."""
        head = self.wal.committed_offset if self.wal is not None else 0
        return sum(sub.lag() for sub in self.reliable_subscriptions()) + sum(
            max(0, head - n) for n in self.cursors.values()
        )

    def track_cursor(self, subscription: str, next_offset: int) -> None:
        self.cursors[subscription] = next_offset
        if subscription not in self._cursor_gauges:
            self._cursor_gauges[subscription] = metrics.subscription_lag.labels(self.name.full, subscription)
        self._cursor_lag_changed()

    def untrack_cursor(self, subscription: str) -> None:
        """The subscription is about to be consumed again (its own lag gauge takes over) or is gone."""
        if self.cursors.pop(subscription, None) is not None:
            del self._cursor_gauges[subscription]
            metrics.forget_subscription(self.name.full, subscription)

    def _cursor_lag_changed(self) -> None:
        head = self.wal.committed_offset if self.wal is not None else 0
        for sub, next_offset in self.cursors.items():
            self._cursor_gauges[sub].set(max(0, head - next_offset))

    async def release(self) -> None:
        """Persist cursors, end streams, close the WAL (its owner refuses appends already: the RELEASE
        effect of core/lifecycle.py's table)."""
        tasks = list(self.tasks)  # a task's done callback may take itself off the list meanwhile
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.tasks.clear()
        for sub in list(self.subscriptions.values()):
            try:
                await sub.close()
            except Exception:
                log.exception("closing subscription %s on %s failed", sub.name, self.name)
        for name in self.cursors:
            metrics.forget_subscription(self.name.full, name)  # the next owner publishes them
        metrics.forget_topic(self.name.full)
        self.cursors.clear()
        self._cursor_gauges.clear()
        gate = self.claim.replication
        if gate is not None:
            await gate.close(self.lifecycle.state.value)
        if self.wal is not None:
            await self.wal.close()
