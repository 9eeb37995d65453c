"""Reliable subscription driver: one task per subscription running the core state machine.

The task reads the topic's WAL into the dispatch window (`log_feed.py`), sends what the state machine
decides, publishes dead letters (`dead_letters.py`) and persists the cursor (`cursor_flush.py`). It wakes
on the publish notifier (fast path), on acks/nacks and consumer changes, and on a 500 ms heartbeat that
catches anything a missed wake-up would leave waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from ister.broker import metrics
from ister.broker.cursor_flush import CursorFlush, CursorWriter
from ister.broker.dead_letters import DeadLetterPublisher, DeadLetters
from ister.broker.held import HeldRecords
from ister.broker.log_feed import LogFeed
from ister.broker.rate_limits import DispatchThrottle
from ister.broker.sessions import ConsumerSession
from ister.broker.subscription import Subscription
from ister.clock import REAL_CLOCK, Clock, Timer
from ister.core.dispatch import FailurePolicy, Group, ReliableSubscriptionState, SubType
from ister.core.dispatch.types import SubscriptionStats
from ister.core.frames import HEADER_SIZE
from ister.core.record import publish_time_of
from ister.ids import new_id
from ister.limits import HEARTBEAT_SECONDS
from ister.storage.objects.tiered import TieredReader
from ister.storage.wal import Wal, WalReader

log = logging.getLogger(__name__)

WARN_INTERVAL_SECONDS = 10.0
REFILL_ROUNDS = 8  # read-and-dispatch passes per step before yielding to the loop


class ReliableSubscription(Subscription):
    def __init__(
        self,
        topic: str,
        name: str,
        sub_type: SubType,
        *,
        wal: Wal,
        start_offset: int,
        window: int,
        policy: FailurePolicy,
        write_cursor: CursorWriter,
        publish_dead_letter: DeadLetterPublisher,
        reader: TieredReader | WalReader,
        report_gap: Callable[[int, int], None] | None = None,
        retention_start: Callable[[], int] | None = None,
        clock: Clock = REAL_CLOCK,
        throttle: DispatchThrottle | None = None,
    ) -> None:
        super().__init__(topic, name, sub_type)
        self._clock = clock
        self._throttle = throttle  # max_subscription_dispatch_rate: deliveries pause while it says so
        self._wal = wal
        # A TieredReader (objects -> WAL -> live) when the topic has a durable tier, else the WAL's own.
        self._reader = reader
        self._feed = LogFeed(topic, name, wal, sub_type == SubType.KEY_SHARED, report_gap, retention_start)
        self._state = ReliableSubscriptionState(
            sub_type, start_offset=start_offset, window=window, policy=policy, track_resolved=True
        )
        # records of the offsets the state machine holds: frame blocks from the durable tier, single records
        self._held = HeldRecords()
        # consumer name -> in-flight messages requeued when its stream ended (a partition group's only)
        self.released: dict[str, int] = {}
        self._wake = asyncio.Event()
        self._notified = False
        # The heartbeat / next-redelivery timer: armed once and kept while it fires soon enough, instead
        # of a timeout armed and cancelled at every turn (a Danube consumer's acks turn the loop per message).
        self._timer: Timer | None = None
        self._timer_at = 0.0  # when the armed timer fires (clock.monotonic())
        self._timer_fired = False
        self._closed = False
        self._cursor = CursorFlush(write_cursor, clock)
        self._task: asyncio.Task[None] | None = None
        # Held by each dispatch step, and by a cursor reset while it swaps the state and the reader.
        self._step_lock = asyncio.Lock()
        self._epoch = 0  # a new random value at each cursor reset (ConsumeOpened.cursor_epoch)
        self._warned_at = float("-inf")  # the first warning is logged whatever the clock reads
        self._suppressed = 0
        labels = (topic, name)
        self._m_lag = metrics.subscription_lag.labels(*labels)
        self._m_heartbeat = metrics.heartbeat_polls.labels(*labels)
        self._m_notifier = metrics.notifier_polls.labels(*labels)
        self._m_redelivered = metrics.redeliveries.labels(*labels)
        self._m_out = metrics.messages_out.labels(*labels)
        self._m_bytes = metrics.bytes_out.labels(*labels)
        self._m_nacks = metrics.nacks.labels(*labels)
        self._dead_letters = DeadLetters(
            publish_dead_letter, clock, metrics.dlq_total.labels(*labels).inc, self._warn
        )

    def _now_ms(self) -> int:
        return int(self._clock.monotonic() * 1000)

    @property
    def reliable(self) -> bool:
        return True

    @property
    def cursor(self) -> int | None:
        return self._state.cursor

    @property
    def first_open(self) -> int:
        """The lowest offset not yet acknowledged (the cursor + 1)."""
        return self._state.first_open

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"sub:{self.topic}:{self.name}")

    @property
    def epoch(self) -> int:
        return self._epoch

    async def reset(self, start: int, reader: TieredReader | WalReader) -> int:
        """Move the subscription to `start` (the first offset delivered next), consumers attached or not
        (docs/admin.md, reset-cursor): the cursor `start - 1` is persisted first (on failure nothing changes
        and the error is raised); then the dispatch state is rebuilt at `start` with `reader`, every
        consumer's stream ends (the consumers reconnect and receive from `start`; what they had in flight is
        forgotten, and acks sent on their old streams are ignored: `epoch` changes). Returns how many
        consumers were attached."""
        async with self._step_lock:
            try:
                await self._cursor.moved(start - 1)
            except BaseException:
                reader.close()
                raise
            old = self._state
            attached = sum(1 for s in self.consumers.values() if s.attached)
            self.end_streams()  # on the old state: its in-flight messages go with it
            state = ReliableSubscriptionState(
                self.sub_type, start_offset=start, window=old.window, policy=old.policy, track_resolved=True
            )
            designating, designated = old.designation
            if designating:
                state.designate(designated)
            self._state = state
            self._reader.close()
            self._reader = reader
            self._held = HeldRecords()
            self.released.clear()
            self._epoch = new_id()
        self._update_lag()
        self._poke()
        log.info("%s/%s: cursor reset to %d (%d consumers moved)", self.topic, self.name, start, attached)
        return attached

    # -- notifications -----------------------------------------------------------------------------------
    def notify(self) -> None:
        """New messages were committed to the WAL (the notifier fast path)."""
        self._notified = True
        self._wake.set()

    def _poke(self) -> None:
        self._wake.set()

    # -- consumer hooks ------------------------------------------------------------------------------------
    def _on_add(self, session: ConsumerSession) -> None:
        pass

    def _on_remove(self, session: ConsumerSession) -> None:
        self._released_by(session.name, self._state.remove(session.id, self._now_ms()))
        self._poke()

    def _on_attach(self, session: ConsumerSession) -> None:
        self._state.attach(session.id, session.key_filters, self._now_ms())
        self._poke()

    def _on_detach(self, session: ConsumerSession) -> None:
        self._released_by(session.name, self._state.detach(session.id, self._now_ms()))
        self._poke()

    def _released_by(self, name: str, n: int) -> None:
        # A partition group's subscription: the handoff away from this consumer reports these as redelivered.
        if n and self.on_change is not None:
            self.released[name] = self.released.get(name, 0) + n

    # -- partitioned subscriptions (the coordinator designates the consumer of this partition) --------------
    def attached_names(self) -> dict[str, int]:
        return {s.name: s.id for s in self.consumers.values() if s.attached}

    def active_name(self) -> str | None:
        """The consumer receiving from this subscription now (Failover), by name."""
        cid = self._state.active_consumer()
        session = self.consumers.get(cid) if cid is not None else None
        return session.name if session is not None else None

    def designate(self, consumer_id: int | None) -> None:
        self._state.designate(consumer_id)
        self._poke()

    def undesignate(self) -> None:
        self._state.undesignate()
        self._poke()

    def stats(self) -> SubscriptionStats:
        """The dispatch state's snapshot (window, in flight, redeliveries, dead letters: admin stats)."""
        return self._state.stats()

    def in_flight_of(self, consumer_id: int) -> int:
        return self._state.in_flight_of(consumer_id)

    def take_released(self, name: str) -> int:
        """How many in-flight messages consumer `name` handed back when its stream ended (they go to the
        partition's next consumer), since the last call."""
        return self.released.pop(name, 0)

    def requeue(self, consumer_id: int) -> int:
        n = self._state.requeue(consumer_id, self._now_ms())
        self._poke()
        return n

    async def ack(self, offset: int) -> bool:
        now = self._now_ms()
        sent = self._state.delivered_at(offset)
        known = self._state.on_ack(offset, now)
        if not known:
            self._warn("ack of offset %d that is not in flight; ignored", offset)
            return False
        if sent is not None:
            metrics.ack_latency.observe((now - sent) / 1000)
        self._held.records.pop(offset, None)
        self._cursor.acked(1)
        self._poke()
        return True

    async def ack_range(self, first: int, last: int, consumer_id: int) -> int:
        now = self._now_ms()
        sent = self._state.delivered_at(last)  # the newest of the range: its delivery to this ack
        acked = self._state.ack_range(first, last, now)
        if acked:
            if sent is not None:
                metrics.ack_latency.observe((now - sent) / 1000)
            self._cursor.acked(acked)
            self._poke()
        return acked

    async def ack_upto(self, offset: int, consumer_id: int) -> int:
        now = self._now_ms()
        sent = self._state.delivered_at(offset)
        acked = self._state.ack_upto(offset, consumer_id, now)
        if acked:
            if sent is not None:
                metrics.ack_latency.observe((now - sent) / 1000)
            self._cursor.acked(acked)
            self._poke()
        return acked

    async def nack_range(
        self, first: int, last: int, consumer_id: int, delay_ms: int | None, reason: str | None
    ) -> int:
        n = self._state.nack_range(first, last, self._now_ms(), delay_ms, reason)
        if n:
            self._m_nacks.inc(n)
            self._poke()
        return n

    async def poison(self, offset: int, reason: str) -> bool:
        handled = self._state.on_poison(offset, self._now_ms(), reason)
        if handled:
            self._poke()
        return handled

    @property
    def window(self) -> int:
        return self._state.window

    def set_window(self, window: int) -> None:
        self._state.set_window(window)
        self._poke()

    async def nack(self, offset: int, delay_ms: int | None, reason: str | None) -> bool:
        known = self._state.on_nack(offset, self._now_ms(), delay_ms, reason)
        if known:
            self._m_nacks.inc()
            self._poke()
        else:
            self._warn("nack of offset %d that is not in flight; ignored", offset)
        return known

    # -- the loop -------------------------------------------------------------------------------------------
    async def _run(self) -> None:
        try:
            while not self._closed:
                try:
                    async with self._step_lock:
                        await self._step()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    self._warn("dispatch step failed, retrying on the next heartbeat: %r", exc)
                self._arm_timer(self._sleep_for())
                await self._wake.wait()
                if self._notified:
                    self._m_notifier.inc()
                elif self._timer_fired:
                    self._m_heartbeat.inc()
                self._wake.clear()
                self._notified = False
                self._timer_fired = False
        finally:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    def _arm_timer(self, timeout: float) -> None:
        """Have the loop woken within `timeout` seconds: keep the armed timer if it fires by then (an early
        turn does no harm), else arm one."""
        at = self._clock.monotonic() + timeout
        timer = self._timer
        if timer is not None:
            if self._timer_at <= at:
                return
            timer.cancel()
        self._timer_at = at
        self._timer = self._clock.call_later(timeout, self._timer_due)

    def _timer_due(self) -> None:
        self._timer = None
        self._timer_fired = True
        self._wake.set()

    def _sleep_for(self) -> float:
        timeout = HEARTBEAT_SECONDS
        wakeup = self._state.next_wakeup()
        if wakeup is not None:
            timeout = min(timeout, max(0.0, (wakeup - self._now_ms()) / 1000))
        if self._throttle is not None and (pause := self._throttle.pause()) > 0:
            timeout = min(timeout, pause)
        return timeout

    async def _step(self) -> None:
        now = self._now_ms()
        state = self._state
        state.tick(now)
        throttle = self._throttle
        allowance = throttle.allowance() if throttle is not None else None
        rounds = 0 if allowance == 0 else REFILL_ROUNDS
        for _ in range(rounds):
            try:
                await self._feed.fill(state, self._reader, self._held, now, allowance)
            except Exception:
                # A read failed (object store down, a damaged object): what was read before it still goes
                # out now; the read is retried on the next heartbeat.
                self._deliver(state.poll_groups(now))
                raise
            self._deliver(state.poll_groups(now))
            # A poll can make room (Key-Shared messages nobody accepts leave the window): read on at once.
            if not (state.capacity() > 0 and self._reader.available() > 0 and state.attached_consumers()):
                break
            if throttle is not None:
                break  # the allowance was offered: the next one comes with the rate's tokens
        else:
            if rounds:
                self._poke()  # more to read: the next pass comes without waiting for a wake-up
        await self._dead_letters.send(state, self._held)
        self._prune()
        await self._cursor.flush(state.cursor)
        self._update_lag()

    def _deliver(self, groups: list[Group]) -> None:
        """Hand each consumer its messages as chunks (runs of frames as read, or records)."""
        sent = nbytes = redelivered = 0  # metrics are updated once per call: each inc() takes a lock
        oldest: int | None = None  # publish time (unix ms) of the oldest record delivered a first time
        for cid, offsets, redelivery in groups:
            session = self.consumers.get(cid)
            stream = session.stream if session is not None else None
            chunks = self._held.chunks(offsets, redelivery) if stream is not None else None
            if session is None or stream is None or chunks is None:
                # The consumer vanished between poll and send: hand the messages back for redelivery.
                self._state.detach(cid, self._now_ms())
                continue
            for chunk in chunks:
                if not stream.offer_chunk(chunk):
                    # A full buffer means the client stopped reading: end its stream so it reconnects, and
                    # let the state machine redeliver what it held.
                    self.detach(session)
                    break
                sent += chunk.count
                nbytes += chunk.nbytes - HEADER_SIZE * chunk.count
                if redelivery:
                    redelivered += chunk.count
            if not redelivery and offsets:
                record = self._held.get(offsets[0])
                stamp = publish_time_of(record) if record is not None else None
                if stamp and (oldest is None or stamp < oldest):
                    oldest = stamp
        if sent:
            if self._throttle is not None:
                self._throttle.charge(sent)
            self._m_out.inc(sent)
            self._m_bytes.inc(nbytes)
            self.messages_out += sent
            self.bytes_out += nbytes
            if oldest is not None:
                metrics.dispatch_delay.observe(self._clock.time() - oldest / 1000)
        if redelivered:
            self._m_redelivered.inc(redelivered)

    def _warn(self, msg: str, *args: object) -> None:
        """Warnings a client can trigger at will are logged at most once per interval per subscription."""
        now = self._clock.monotonic()
        if now - self._warned_at < WARN_INTERVAL_SECONDS:
            self._suppressed += 1
            return
        if self._suppressed:
            msg += f" ({self._suppressed} similar warnings suppressed)"
            self._suppressed = 0
        self._warned_at = now
        log.warning("%s/%s: " + msg, self.topic, self.name, *args)

    def _prune(self) -> None:
        """Forget payloads the state machine no longer holds (acked, dropped, dead-lettered)."""
        state = self._state
        self._held.prune(state.take_resolved(), state.first_open, state.held_offsets())

    def lag(self) -> int:
        """Messages published but not yet acknowledged on this subscription (its backlog)."""
        return int(self._state.lag(self._wal.committed_offset))

    def _update_lag(self) -> None:
        head = self._wal.committed_offset
        self._m_lag.set(self._state.lag(head))

    async def close(self) -> None:
        self._closed = True
        self._wake.set()
        if self.on_close is not None:
            self.on_close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        self.end_streams()
        self._reader.close()
        try:
            await self._cursor.flush(self._state.cursor, force=True)
        except Exception as exc:
            log.warning("%s/%s: cursor flush on close failed: %s", self.topic, self.name, exc)
        metrics.forget_subscription(self.topic, self.name)
