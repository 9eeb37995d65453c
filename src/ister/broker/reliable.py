"""Reliable subscription driver: one task per subscription running the core state machine.

The task reads the topic's WAL into the dispatch window, sends what the state machine decides, publishes
dead letters and persists the cursor. It wakes on the publish notifier (fast path), on acks/nacks and
consumer changes, and on a 500 ms heartbeat that catches anything a missed wake-up would leave waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence

import msgspec

from ister.broker import metrics
from ister.broker.held import HeldRecords
from ister.broker.sessions import ConsumerSession, Record
from ister.broker.subscription import Subscription
from ister.clock import REAL_CLOCK, Clock, Timer
from ister.core.backoff import Backoff, Retries
from ister.core.dispatch import DeadLetter, FailurePolicy, Group, ReliableSubscriptionState, SubType
from ister.core.dispatch.types import SubscriptionStats
from ister.core.frameblock import FrameBlock
from ister.core.frames import HEADER_SIZE
from ister.core.record import StoredMessage, decode_message, publish_time_of
from ister.errors import OffsetOutOfRange
from ister.ids import new_id
from ister.limits import CURSOR_FLUSH_ACKS, CURSOR_FLUSH_SECONDS, HEARTBEAT_SECONDS
from ister.storage.objects.tiered import TieredReader
from ister.storage.wal import Wal, WalReader

log = logging.getLogger(__name__)

DeadLetterPublisher = Callable[[StoredMessage, DeadLetter], Awaitable[None]]
CursorWriter = Callable[[int], Awaitable[None]]

DLQ_BACKOFF_MIN_SECONDS = 0.5
DLQ_BACKOFF_MAX_SECONDS = 30.0
WARN_INTERVAL_SECONDS = 10.0
REFILL_ROUNDS = 8  # read-and-dispatch passes per step before yielding to the loop


DLQ_BACKOFF = Backoff(first=DLQ_BACKOFF_MIN_SECONDS, cap=DLQ_BACKOFF_MAX_SECONDS)


def _dead_letter_message(record: Record) -> StoredMessage:
    """The message to dead-letter for a stored record; a record that does not decode travels whole as the
    payload, so that the dead letter can be published (and delivered) and nothing is lost."""
    try:
        return decode_message(record)
    except msgspec.DecodeError:
        return StoredMessage(payload=bytes(record), publish_time=0, producer_id=0, producer_name="")


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
    ) -> None:
        super().__init__(topic, name, sub_type)
        self._clock = clock
        self._wal = wal
        # A TieredReader (objects -> WAL -> live) when the topic has a durable tier, else the WAL's own.
        self._reader = reader
        self._report_gap = report_gap  # the topic counts and logs each missing offset once
        self._retention_start = retention_start  # offsets below it were deleted by retention
        self._retention_warned = False
        self._state = ReliableSubscriptionState(
            sub_type, start_offset=start_offset, window=window, policy=policy, track_resolved=True
        )
        # records of the offsets the state machine holds: frame blocks from the durable tier, single records
        self._held = HeldRecords()
        # consumer name -> in-flight messages requeued when its stream ended (a partition group's only)
        self.released: dict[str, int] = {}
        self._needs_key = sub_type == SubType.KEY_SHARED
        self._write_cursor = write_cursor
        self._publish_dead_letter = publish_dead_letter
        self._wake = asyncio.Event()
        self._notified = False
        # The heartbeat / next-redelivery timer: armed once and kept while it fires soon enough, instead
        # of a timeout armed and cancelled at every turn (a Danube consumer's acks turn the loop per message).
        self._timer: Timer | None = None
        self._timer_at = 0.0  # when the armed timer fires (clock.monotonic())
        self._timer_fired = False
        self._closed = False
        self._persisted_cursor: int | None = None
        self._acks_since_flush = 0
        self._last_flush = clock.monotonic()
        self._task: asyncio.Task[None] | None = None
        # Held by each dispatch step, and by a cursor reset while it swaps the state and the reader.
        self._step_lock = asyncio.Lock()
        self._epoch = 0  # a new random value at each cursor reset (ConsumeOpened.cursor_epoch)
        self._dlq_retry_at = 0.0
        self._dlq_retries = Retries(DLQ_BACKOFF)
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
        self._m_dlq = metrics.dlq_total.labels(*labels)

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
                await self._write_cursor(start - 1)
            except BaseException:
                reader.close()
                self._persisted_cursor = None  # maybe written: the next flush writes the current cursor
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
            self._persisted_cursor = start - 1
            self._acks_since_flush = 0
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
        self._acks_since_flush += 1
        self._poke()
        return True

    async def ack_range(self, first: int, last: int, consumer_id: int) -> int:
        now = self._now_ms()
        sent = self._state.delivered_at(last)  # the newest of the range: its delivery to this ack
        acked = self._state.ack_range(first, last, now)
        if acked:
            if sent is not None:
                metrics.ack_latency.observe((now - sent) / 1000)
            self._acks_since_flush += acked
            self._poke()
        return acked

    async def ack_upto(self, offset: int, consumer_id: int) -> int:
        now = self._now_ms()
        sent = self._state.delivered_at(offset)
        acked = self._state.ack_upto(offset, consumer_id, now)
        if acked:
            if sent is not None:
                metrics.ack_latency.observe((now - sent) / 1000)
            self._acks_since_flush += acked
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
        return timeout

    async def _step(self) -> None:
        now = self._now_ms()
        state = self._state
        state.tick(now)
        for _ in range(REFILL_ROUNDS):
            try:
                await self._fill(now)
            except Exception:
                # A read failed (object store down, a damaged object): what was read before it still goes
                # out now; the read is retried on the next heartbeat.
                self._deliver(state.poll_groups(now))
                raise
            self._deliver(state.poll_groups(now))
            # A poll can make room (Key-Shared messages nobody accepts leave the window): read on at once.
            if not (state.capacity() > 0 and self._reader.available() > 0 and state.attached_consumers()):
                break
        else:
            self._poke()  # more to read: the next pass comes without waiting for a wake-up
        await self._dead_letters()
        self._prune()
        await self._maybe_flush_cursor()
        self._update_lag()

    async def _fill(self, now: int) -> None:
        if not self._state.attached_consumers():
            return  # nobody to deliver to: leave the log where it is (publishers pay nothing for us)
        state, reader = self._state, self._reader
        while (capacity := state.capacity()) > 0 and reader.available() > 0:
            if isinstance(reader, TieredReader):
                got = await reader.read_frames(max_records=capacity, timeout=0)
                if isinstance(got, FrameBlock):
                    self._offer_block(got, now)
                    continue
                records = got
            else:
                try:
                    records = await reader.read(max_records=capacity, timeout=0)
                except OffsetOutOfRange:
                    if reader.next_offset >= self._wal.first_offset:
                        raise
                    reader.next_offset = self._wal.first_offset  # retention dropped the files below it
                    continue
            if not records:
                break
            self._held.add_records(records)
            if self._needs_key:
                keys = [decode_message(payload).key for _, payload in records]
            else:  # only Key-Shared routes by key: skip decoding here (the batch API never decodes)
                keys = [""] * len(records)
            first = records[0][0]
            if first == state.next_offset and records[-1][0] - first == len(records) - 1:
                state.offer_batch(first, keys, now)
            else:
                self._offer_across_gaps(records, keys, now)
        # The reader went past offsets that exist nowhere (and has nothing after them yet): the cursor may
        # pass them as soon as everything below is acknowledged.
        if state.next_offset < reader.next_offset:
            self._skip(reader.next_offset, now)

    def _offer_block(self, block: FrameBlock, now: int) -> None:
        """Offer the consecutive offsets of frames read from the durable tier (after a skipped range, if the
        reader passed one)."""
        self._held.add_block(block)
        if self._needs_key:
            keys = [decode_message(payload).key for payload in block.payloads()]
        else:
            keys = [""] * block.count
        if block.first > self._state.next_offset:
            self._skip(block.first, now)
        self._state.offer_batch(block.first, keys, now)

    def _offer_across_gaps(self, records: Sequence[tuple[int, object]], keys: list[str], now: int) -> None:
        """Offer records that skip offsets (gaps never wedge: docs/architecture.md §12): each gap is skipped,
        each run offered."""
        state = self._state
        run_start = 0
        for i in range(1, len(records) + 1):
            if i < len(records) and records[i][0] == records[i - 1][0] + 1:
                continue
            first = records[run_start][0]
            if first > state.next_offset:
                self._skip(first, now)
            state.offer_batch(first, keys[run_start:i], now)
            run_start = i

    def _skip(self, end: int, now: int) -> None:
        first = self._state.next_offset
        self._state.skip(first, end, now)
        floor = self._retention_start() if self._retention_start is not None else 0
        if first < floor:  # retention deleted them before this subscription read them: counted, not a gap
            upto = min(end, floor)
            metrics.retention_skipped.inc(upto - first)
            if not self._retention_warned:
                self._retention_warned = True
                log.warning(
                    "%s/%s: retention deleted offsets %d..%d before this subscription read them; "
                    "it continues at %d",
                    self.topic,
                    self.name,
                    first,
                    upto - 1,
                    upto,
                )
            first = upto
        if first < end and self._report_gap is not None:
            self._report_gap(first, end)

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

    async def _dead_letters(self) -> None:
        if self._clock.monotonic() < self._dlq_retry_at:
            return  # the last dead-letter publish failed: back off instead of retrying every heartbeat
        for dead in self._state.take_dead_letters():
            record = self._held.get(dead.offset)
            if record is None:
                self._state.resolve_dead_letter(dead.offset)
                continue
            try:
                await self._publish_dead_letter(_dead_letter_message(record), dead)
            except Exception as exc:
                wait = self._dlq_retries.next()
                self._warn(
                    "dead-letter publish of offset %d failed (retry in %.1f s): %s", dead.offset, wait, exc
                )
                self._state.dead_letter_failed(dead.offset)
                self._dlq_retry_at = self._clock.monotonic() + wait
                continue
            self._dlq_retries.reset()
            self._state.resolve_dead_letter(dead.offset)
            self._held.records.pop(dead.offset, None)
            self._m_dlq.inc()

    def _prune(self) -> None:
        """Forget payloads the state machine no longer holds (acked, dropped, dead-lettered)."""
        state = self._state
        self._held.prune(state.take_resolved(), state.first_open, state.held_offsets())

    async def _maybe_flush_cursor(self, force: bool = False) -> None:
        cursor = self._state.cursor
        if cursor is None or cursor == self._persisted_cursor:
            return
        due = (
            force
            or self._acks_since_flush >= CURSOR_FLUSH_ACKS
            or self._clock.monotonic() - self._last_flush >= CURSOR_FLUSH_SECONDS
        )
        if not due:
            return
        await self._write_cursor(cursor)
        self._persisted_cursor = cursor
        self._acks_since_flush = 0
        self._last_flush = self._clock.monotonic()

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
            await self._maybe_flush_cursor(force=True)
        except Exception as exc:
            log.warning("%s/%s: cursor flush on close failed: %s", self.topic, self.name, exc)
        metrics.forget_subscription(self.topic, self.name)
