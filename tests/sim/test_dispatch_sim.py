"""Seeded random schedules against the reliable dispatch state machine, with invariants after every step.

Each seed draws a policy, a window and a start offset, then runs random attach/detach/remove, offer, poll,
ack (also bogus and late), nack, clock advance and dead-letter publish/failure steps, and the batch
operations (offer_batch, ack_range, cumulative ack_upto, nack_range, set_window), checking the state after
each against a model (also take_resolved, when the seed tracks it, and the in-flight bookkeeping). It then
drives to quiescence (acking one by one, by range or cumulatively) and checks every offered message ended
exactly as the poison policy says. A failure message names the sub type and seed; rerun one with
`run(sub_type, seed)`.

Gaps: two thirds of the seeds also skip ranges the log does not have (`skip`, from 1 to 10^9 offsets) at
random moments, and feed "reads" with holes through `split_runs`; the checks then also say that no skipped
offset is held or delivered, that late fills of a skipped range are refused, that skips take no capacity,
and that the cursor passes a skipped range exactly when everything below it is resolved.
"""

from __future__ import annotations

import random
from collections import defaultdict

import pytest

from ister.core.dispatch import (
    BackoffStrategy,
    Delivery,
    EntryState,
    FailurePolicy,
    PoisonPolicy,
    ReliableSubscriptionState,
    SubType,
    glob_match,
    split_runs,
)
from ister.core.dispatch.keyhash import filters_match
from ister.errors import FailedPrecondition

SEEDS_PER_CHUNK = 100
CHUNKS = 10  # 1000 seeds per sub type
STEPS = 60
KEYS = ["eu-1", "eu-2", "us-1", "us-2", "ap-1"]
FILTER_SETS: list[tuple[str, ...]] = [(), (), ("eu-*",), ("us-?",), ("eu-*", "ap-*"), ("*-1",)]
CONSUMERS = [1, 2, 3]
WINDOWS = [1, 2, 3, 5, 8]
FINAL_CONSUMER = 99
BACKOFFS: list[BackoffStrategy] = ["Exponential", "Fixed"]
POISONS: list[PoisonPolicy] = ["DeadLetter", "Drop", "Block"]
GAP_RATES = [0.0, 0.05, 0.12]  # share of steps that skip a range or read records with holes
GAP_LENGTHS = [1, 1, 2, 3, 7, 40, 10**9]


class SimFailure(AssertionError):
    pass


class Sim:
    def __init__(self, sub_type: SubType, seed: int) -> None:
        self.rng = rng = random.Random(seed)
        self.sub_type = sub_type
        base = rng.choice([0, 10, 50])
        self.policy = FailurePolicy(
            max_redelivery_count=rng.randint(0, 3),
            ack_timeout_ms=rng.choice([50, 200, 500]),
            base_redelivery_delay_ms=base,
            max_redelivery_delay_ms=base + rng.choice([0, 100, 300]),
            backoff=rng.choice(BACKOFFS),
            poison_policy=rng.choice(POISONS),
        )
        self.window = rng.choice(WINDOWS)
        self.peak_window = self.window
        self.start = rng.randint(0, 5)
        self.track = rng.random() < 0.5
        self.unmatched_limit = rng.choice([0, 1, 3, 1000])
        self.quiesce_mode = rng.choice(["single", "range", "cumulative"])
        self.s = ReliableSubscriptionState(
            sub_type,
            start_offset=self.start,
            window=self.window,
            policy=self.policy,
            track_resolved=self.track,
            unmatched_limit=self.unmatched_limit,
        )
        self.now = rng.randint(0, 1000)
        self.attached: dict[int, tuple[str, ...]] = {}  # model: attached consumers and their filters
        self.known: set[int] = set()
        self.failover_order: list[int] = []
        self.received: dict[int, list[int]] = defaultdict(list)  # what each live stream holds unacked
        self.keys: dict[int, str] = {}
        self.deliveries: dict[int, int] = defaultdict(int)
        self.last_to: dict[int, int] = {}  # the consumer each offset was last delivered to
        self.failures: dict[int, int] = defaultdict(int)  # nacks and ack timeouts per offset
        self.sent_at: dict[int, int] = {}
        self.retry_at: dict[int, int] = {}
        self.unresolved: set[int] = set()
        self.acked: set[int] = set()
        self.dead_lettered: set[int] = set()
        self.dropped: set[int] = set()
        self.reported: list[int] = []  # dead letters taken and not yet published
        self.last_cursor: int | None = None
        self.key_order: dict[str, list[int]] = {}  # Key-Shared: first deliveries per key, in order sent
        self.taken_resolved: set[int] = set()
        self.gap_rate = rng.choice(GAP_RATES)
        self.gaps: list[tuple[int, int]] = []  # model: skipped [first, end) ranges, ascending
        self.passed = 0  # gaps[:passed] were seen passed by the cursor (which never moves back)
        self.skipped_total = 0

    # -- checks ------------------------------------------------------------------------------------------
    def check(self, cond: bool, what: str) -> None:
        if not cond:
            raise SimFailure(what)

    def reconcile(self) -> set[int]:
        """Account for offsets that left the window without an ack or a dead-letter publish: drops."""
        held = set(self.s.held_offsets())
        for off in self.unresolved - held:
            self.check(self.policy.poison_policy == "Drop", f"offset {off} vanished without a Drop policy")
            self.check(self.failures[off] == self.policy.max_redelivery_count + 1, f"{off} dropped too early")
            self.dropped.add(off)
        self.unresolved &= held
        return held

    def after_step(self) -> None:
        s = self.s
        held = self.reconcile()
        self.check(held == self.unresolved, f"window {sorted(held)} != model {sorted(self.unresolved)}")
        self.check(len(s.held_offsets()) == len(held), "held view length")
        # Key-Shared: held messages of keys no attached consumer accepts wait outside the window (up to the
        # limit), once a poll has found them for the current consumer set; every other message counts.
        unmatched = 0
        if self.sub_type is SubType.KEY_SHARED:
            filters = list(self.attached.values())
            unmatched = sum(1 for o in held if not any(filters_match(f, self.keys[o]) for f in filters))
            kq = s._kq
            self.check(
                kq.n_unmatched == sum(1 for o in held if self.keys[o] in kq.unmatched), "unmatched count"
            )
            if kq.parked_version == s._selector.version:
                for key in kq.unmatched:
                    self.check(not any(filters_match(f, key) for f in filters), f"{key} counted unmatched")
        extra = min(unmatched, self.unmatched_limit)
        # (a consumer set change may make waiting messages count again: they stay, nothing is dropped)
        bound = self.peak_window + (self.unmatched_limit if self.sub_type is SubType.KEY_SHARED else 0)
        self.check(len(held) <= bound, "window bound")
        floor = max(0, self.window - len(held))
        self.check(floor <= s.capacity() <= max(0, self.window - len(held) + extra), "capacity")
        self.check(s.in_flight_count <= len(held), "in-flight bound")
        first_open = min(held) if held else s.next_offset
        expected = first_open - 1 if first_open > self.start else None
        self.check(s.cursor == expected, f"cursor {s.cursor} != {expected}")
        if self.last_cursor is not None:
            self.check(s.cursor is not None and s.cursor >= self.last_cursor, "cursor moved backwards")
        self.last_cursor = s.cursor
        limit = self.policy.max_redelivery_count
        for off in self.unresolved:
            state = s.state_of(off)
            if state is EntryState.EXHAUSTED:
                self.check(
                    self.failures[off] == limit + 1, f"{off} exhausted after {self.failures[off]} failures"
                )
            else:
                self.check(
                    self.failures[off] <= limit, f"{off} not exhausted after {self.failures[off]} failures"
                )
        in_flight = s.in_flight()
        self.check(len(in_flight) == s.in_flight_count, "in-flight count")
        self.check(all(c in self.attached for c in in_flight.values()), "in flight at a detached consumer")
        if self.sub_type.single_active:
            active = s.active_consumer()
            if self.sub_type is SubType.FAILOVER:
                want = self.failover_order[0] if self.failover_order else None
                self.check(active == want, f"active {active} != {want}")
            self.check((active is None) == (not self.attached), "active consumer presence")
            self.check(all(c == active for c in in_flight.values()), "in flight outside the active consumer")
        if self.sub_type is SubType.KEY_SHARED:
            holder_of_key: dict[str, int] = {}
            for off, cid in in_flight.items():
                key = self.keys[off]
                self.check(holder_of_key.setdefault(key, cid) == cid, f"key {key} in flight at two consumers")
        for off, cid in in_flight.items():
            self.check(self.last_to.get(off) == cid, f"{off} in flight at {cid}, last sent to {self.last_to}")
        self.check_gaps(held)
        self.check_resolved_log()
        self.check_bookkeeping()

    def in_gap(self, off: int) -> bool:
        return any(first <= off < end for first, end in self.gaps)

    def check_gaps(self, held: set[int]) -> None:
        """Skipped offsets are never held and take no capacity; the cursor passes a range exactly when
        everything below it is resolved."""
        s = self.s
        if self.passed == len(self.gaps):
            return
        view = s.held_offsets()
        open_gaps = self.gaps[self.passed :]
        self.check(not any(f <= o < e for o in held for f, e in open_gaps), "a skipped offset is held")
        cursor = -1 if s.cursor is None else s.cursor
        lowest = min(held) if held else None
        all_passed = True
        for first, end in open_gaps:
            for off in {first, end - 1, (first + end) // 2}:
                self.check(off not in view and s.state_of(off) is None, f"skipped {off} in the window")
            passable = lowest is None or lowest >= end
            self.check((cursor >= end - 1) == passable, f"cursor {s.cursor} vs gap [{first}, {end})")
            all_passed = all_passed and passable
            if all_passed:
                self.passed += 1

    def check_resolved_log(self) -> None:
        """take_resolved returns each resolved offset exactly once."""
        if not self.track:
            return
        got = self.s.take_resolved()
        self.check(len(got) == len(set(got)) and not self.taken_resolved & set(got), "resolved twice")
        self.taken_resolved.update(got)
        fates = self.acked | self.dead_lettered | self.dropped
        self.check(
            self.taken_resolved == fates, f"resolved log {sorted(self.taken_resolved)} != {sorted(fates)}"
        )

    def check_bookkeeping(self) -> None:
        """White box: every in-flight batch's live count matches the offsets that point at it."""
        flight = self.s._flight
        counts: dict[int, int] = defaultdict(int)
        batches = {}
        for batch in flight.holder.values():
            counts[id(batch)] += 1
            batches[id(batch)] = batch
        for key, batch in batches.items():
            self.check(batch.live == counts[key], f"batch live {batch.live} != {counts[key]}")
        self.check(flight._live == len(batches), f"live batches {flight._live} != {len(batches)}")

    def after_poll(self, ds: list[Delivery]) -> None:
        s = self.s
        self.reconcile()  # poll applies due ack timeouts first, which may drop messages
        for d in ds:
            self.check(d.consumer_id in self.attached, f"delivery of {d.offset} to detached {d.consumer_id}")
            self.check(not self.in_gap(d.offset), f"delivery of skipped offset {d.offset}")
            self.check(d.offset in self.unresolved, f"delivery of resolved offset {d.offset}")
            self.deliveries[d.offset] += 1
            self.last_to[d.offset] = d.consumer_id
            if d.redelivery:
                self.check(
                    self.now >= self.retry_at[d.offset], f"{d.offset} redelivered before its retry time"
                )
            self.sent_at[d.offset] = self.now
            self.check(d.attempt == self.deliveries[d.offset] and d.redelivery == (d.attempt > 1), "attempt")
            self.received[d.consumer_id].append(d.offset)
            if self.sub_type.single_active:
                self.check(d.consumer_id == s.active_consumer(), "delivery to a standby")
            if self.sub_type is SubType.KEY_SHARED:
                # the rule: every unresolved message of its key below it is in flight at the same consumer
                # (sent earlier, or earlier in this poll), and nothing of its key is in flight elsewhere
                key = self.keys[d.offset]
                now_at = s.in_flight()
                earlier = [
                    o
                    for o in self.unresolved
                    if o < d.offset and self.keys[o] == key and now_at.get(o) != d.consumer_id
                ]
                self.check(not earlier, f"offset {d.offset} of key {key} delivered before {earlier}")
                elsewhere = [o for o, c in now_at.items() if self.keys[o] == key and c != d.consumer_id]
                self.check(not elsewhere, f"offset {d.offset} of key {key} sent while {elsewhere} elsewhere")
                if not d.redelivery:
                    order = self.key_order.setdefault(key, [])
                    last = order[-1] if order else -1
                    self.check(last < d.offset, f"first deliveries of key {key}: {last} then {d.offset}")
                    order.append(d.offset)
                f = self.attached[d.consumer_id]
                self.check(
                    not f or any(glob_match(p, key) for p in f), "key given to a filtered-out consumer"
                )
        if not self.attached:
            self.check(not ds, "delivery with no consumer")
            return
        blocked = self.policy.poison_policy == "Block" and s.stats().exhausted > 0
        if blocked and self.sub_type is not SubType.KEY_SHARED:
            self.check(all(d.redelivery for d in ds), "new message delivered while blocked")
        wake = s.next_wakeup()
        self.check(wake is None or wake > self.now, "a due timer survived poll")
        for off in self.unresolved:
            if s.state_of(off) is not EntryState.PENDING:
                continue
            if self.sub_type is not SubType.KEY_SHARED:
                self.check(blocked, f"offset {off} left pending with a consumer attached")
                continue
            # a never-sent message may wait only behind a message of its key to send again, while its key
            # is in flight at a consumer it no longer routes to, or while no consumer accepts its key
            key = self.keys[off]
            now_at = s.in_flight()
            behind = any(
                o < off
                and self.keys[o] == key
                and o not in now_at
                and s.state_of(o) is not EntryState.PENDING
                for o in self.unresolved
            )
            route = s._selector.for_key(key)
            moving = any(self.keys[o] == key and c != route for o, c in now_at.items())
            eligible = any(not f or any(glob_match(p, key) for p in f) for f in self.attached.values())
            self.check(behind or moving or not eligible, f"offset {off} (key {key}) left pending")

    # -- actions -----------------------------------------------------------------------------------------
    def expect_timeouts(self) -> set[int]:
        """Offsets whose ack deadline has passed: the next tick or poll must fail them."""
        timeout = self.policy.ack_timeout_ms
        expiring = {o for o in self.s.in_flight() if self.sent_at[o] + timeout <= self.now}
        for off in expiring:
            self.failed(off, None)
        return expiring

    def failed(self, off: int, delay: int | None) -> None:
        self.failures[off] += 1
        self.retry_at[off] = self.now + self.policy.retry_delay_ms(self.failures[off], delay)

    def requeued(self, cid: int) -> None:
        for off, holder in self.s.in_flight().items():
            if holder == cid:
                self.retry_at[off] = self.now

    def poll(self) -> list[Delivery]:
        self.expect_timeouts()
        ds = self.s.poll(self.now)
        self.after_poll(ds)
        return ds

    def tick(self) -> None:
        expiring = self.expect_timeouts()
        self.check(self.s.tick(self.now) == len(expiring), "tick count")
        self.check(not expiring & set(self.s.in_flight()), "a timed-out message is still in flight")

    def offer(self, n: int) -> None:
        for _ in range(min(n, self.s.capacity())):
            off = self.s.next_offset
            key = self.rng.choice(KEYS)
            self.keys[off] = key
            self.s.offer(off, key, self.now)
            self.unresolved.add(off)

    def offer_batch(self, n: int) -> None:
        s = self.s
        first = s.next_offset
        keys = [self.rng.choice(KEYS) for _ in range(n)]
        if n > s.capacity() or self.rng.random() < 0.05:
            bad_first = first if n > s.capacity() else first + self.rng.choice([-1, 1])
            try:
                s.offer_batch(bad_first, keys, self.now)
            except ValueError:
                self.check(s.next_offset == first, "refused offer_batch changed the window")
                return
            raise SimFailure(f"offer_batch of {n} at {bad_first} accepted (next {first}, cap {s.capacity()})")
        s.offer_batch(first, keys, self.now)
        for i, key in enumerate(keys):
            self.keys[first + i] = key
            self.unresolved.add(first + i)
        self.check(s.next_offset == first + n, "offer_batch next_offset")

    def skip(self) -> None:
        s = self.s
        first = s.next_offset
        length = self.rng.choice(GAP_LENGTHS)
        if self.rng.random() < 0.1:  # misuse: not at next_offset, or end below first
            bad_first, bad_end = self.rng.choice(
                [(first + 1, first + 1 + length), (first - 1, first + length), (first, first - 1)]
            )
            cap = s.capacity()
            try:
                s.skip(bad_first, bad_end, self.now)
            except ValueError:
                self.check(s.next_offset == first and s.capacity() == cap, "refused skip changed the window")
                return
            raise SimFailure(f"skip({bad_first}, {bad_end}) accepted at next {first}")
        cap = s.capacity()
        self.check(s.skip(first, first + length, self.now) == length, "skip count")
        self.record_gap(first, first + length)
        self.check(s.next_offset == first + length and s.capacity() == cap, "skip took capacity")
        if self.rng.random() < 0.3:  # a late fill of the range is refused
            late = self.rng.randrange(first, first + length)
            try:
                s.offer(late, self.rng.choice(KEYS), self.now)
            except ValueError:
                self.check(s.next_offset == first + length, "refused late fill changed the window")
                return
            raise SimFailure(f"late fill of skipped {late} accepted")

    def record_gap(self, first: int, end: int) -> None:
        self.gaps.append((first, end))
        self.skipped_total += end - first
        self.check(self.s.stats().skipped_total == self.skipped_total, "skipped count")

    def read_with_holes(self) -> None:
        """A read from the log that returns records with holes: fed run by run through split_runs."""
        s, rng = self.s, self.rng
        first = s.next_offset
        found: list[int] = []
        off = first
        for _ in range(rng.randint(0, min(5, s.capacity()))):
            off += rng.choice([0, 0, 0, 1, 2, 40])
            found.append(off)
            off += 1
        end = off + rng.choice([0, 0, 3]) if rng.random() < 0.5 else None
        for lo, hi, gap in split_runs(first, found, end=end):
            if gap:
                self.check(s.skip(lo, hi, self.now) == hi - lo, "skip count")
                self.record_gap(lo, hi)
                continue
            keys = [rng.choice(KEYS) for _ in range(lo, hi)]
            s.offer_batch(lo, keys, self.now)
            for o, key in zip(range(lo, hi), keys, strict=True):
                self.keys[o] = key
                self.unresolved.add(o)
        self.check(s.next_offset == max(found[-1] + 1 if found else first, end or first), "read next_offset")

    def set_window(self, window: int) -> None:
        self.s.set_window(window)
        self.window = window
        self.peak_window = max(self.peak_window, window)

    def forget_received(self, offsets: set[int]) -> None:
        for held in self.received.values():
            held[:] = [o for o in held if o not in offsets]

    def record_acks(self, offsets: set[int]) -> None:
        self.acked |= offsets
        self.unresolved -= offsets
        self.forget_received(offsets)

    def checked_ack_range(self, first: int, last: int) -> None:
        expect = {o for o in self.unresolved if first <= o <= last and self.deliveries[o] > 0}
        got = self.s.ack_range(first, last, self.now)
        self.check(got == len(expect), f"ack_range({first}, {last}) = {got}, expected {sorted(expect)}")
        self.record_acks(expect)

    def checked_ack_upto(self, cid: int, upto: int) -> None:
        expect = {o for o in self.unresolved if o <= upto and self.last_to.get(o) == cid}
        got = self.s.ack_upto(upto, cid, self.now)
        self.check(got == len(expect), f"ack_upto({upto}, {cid}) = {got}, expected {sorted(expect)}")
        self.record_acks(expect)

    def nack_range(self, first: int, last: int) -> None:
        expect = {o for o in self.s.in_flight() if first <= o <= last}
        delay = self.rng.choice([None, 0, 20, 400])
        got = self.s.nack_range(first, last, self.now, delay, "sim range")
        self.check(got == len(expect), f"nack_range({first}, {last}) = {got}, expected {sorted(expect)}")
        for off in expect:
            self.failed(off, delay)
        self.forget_received(expect)

    def random_offset(self) -> int:
        """Anywhere in the log, or (with gaps, which may be huge) half the time near an offered offset."""
        if self.keys and self.gaps and self.rng.random() < 0.5:
            return self.rng.choice(list(self.keys)) + self.rng.randint(-2, 1)
        return self.rng.randint(self.start - 2, self.s.next_offset + 1)

    def random_span(self) -> tuple[int, int]:
        first = self.random_offset()
        last = first + self.rng.choice([-1, 0, 1, 2, 4, 20])
        return first, last

    def attach(self, cid: int, filters: tuple[str, ...]) -> None:
        if self.sub_type is SubType.EXCLUSIVE and any(c != cid for c in self.attached):
            try:
                self.s.attach(cid, filters, self.now)
            except FailedPrecondition:
                return
            raise SimFailure("second exclusive consumer admitted")
        self.requeued(cid)  # a new stream of an attached consumer takes its in-flight messages back
        self.s.attach(cid, filters, self.now)
        if self.sub_type is SubType.EXCLUSIVE:
            self.known = {cid}
        self.known.add(cid)
        self.received[cid].clear()  # a new stream: whatever the old one held is gone
        if cid not in self.attached:
            self.failover_order.append(cid)
        self.attached[cid] = filters if self.sub_type is SubType.KEY_SHARED else ()

    def detach(self, cid: int, remove: bool) -> None:
        self.requeued(cid)
        if remove:
            self.s.remove(cid, self.now)
            self.known.discard(cid)
        else:
            self.s.detach(cid, self.now)
        self.attached.pop(cid, None)
        if cid in self.failover_order:
            self.failover_order.remove(cid)
        self.received[cid].clear()

    def ack(self, cid: int) -> None:
        held = self.received[cid]
        if held:
            off = held.pop(self.rng.randrange(len(held)))
            self.checked_ack(off)

    def checked_ack(self, off: int) -> None:
        expect = off in self.unresolved and self.deliveries[off] > 0
        got = self.s.on_ack(off, self.now)
        self.check(got == expect, f"ack of {off} returned {got}, expected {expect}")
        if got:
            self.acked.add(off)
            self.unresolved.discard(off)

    def nack(self, cid: int) -> None:
        held = self.received[cid]
        if held:
            off = held.pop(self.rng.randrange(len(held)))
            expect = self.s.state_of(off) is EntryState.IN_FLIGHT
            delay = self.rng.choice([None, 0, 20, 400])
            self.check(self.s.on_nack(off, self.now, delay, "sim") == expect, f"nack of {off}")
            if expect:
                self.failed(off, delay)

    def dead_letters(self) -> None:
        for dl in self.s.take_dead_letters():
            self.check(self.policy.poison_policy == "DeadLetter", "dead letter under another policy")
            self.check(
                dl.offset in self.unresolved and dl.offset not in self.reported, f"bad dead letter {dl}"
            )
            self.check(dl.attempts == self.deliveries[dl.offset], "dead letter attempts")
            self.check(dl.attempts >= self.policy.max_redelivery_count + 1, "dead-lettered too early")
            self.reported.append(dl.offset)

    def publish_dead_letters(self, fail: bool) -> None:
        while self.reported:
            off = self.reported.pop()
            if fail:
                self.check(self.s.dead_letter_failed(off) == (off in self.unresolved), "dead_letter_failed")
                continue
            ok = self.s.resolve_dead_letter(off)
            self.check(ok == (off in self.unresolved), f"resolve_dead_letter({off})")
            if ok:
                self.dead_lettered.add(off)
                self.unresolved.discard(off)

    def step(self) -> None:
        rng = self.rng
        roll = rng.random()
        cid = rng.choice(CONSUMERS)
        if roll < 0.65:
            self.consumer_event(roll, cid)
        else:
            self.broker_event(roll)
        if rng.random() < 0.7:
            self.poll()

    def consumer_event(self, roll: float, cid: int) -> None:
        """What a step with `roll` below 0.65 does: publishing, consumers coming and going, acks, nacks."""
        rng = self.rng
        if roll < 0.13:
            self.offer(rng.randint(1, 4))
        elif roll < 0.20:
            self.offer_batch(rng.randint(0, 5))
        elif roll < 0.28:
            self.attach(cid, rng.choice(FILTER_SETS))
        elif roll < 0.33:
            self.detach(cid, remove=False)
        elif roll < 0.35:
            self.detach(cid, remove=True)
        elif roll < 0.45:
            self.ack(cid)
        elif roll < 0.50:
            self.checked_ack_range(*self.random_span())
        elif roll < 0.54:
            self.checked_ack_upto(cid, max(self.start - 1, self.random_offset()))
        elif roll < 0.59:
            self.nack(cid)
        elif roll < 0.62:
            self.nack_range(*self.random_span())
        else:
            self.checked_ack(max(self.start - 1, self.random_offset()))  # bogus or late

    def broker_event(self, roll: float) -> None:
        """What a step with `roll` from 0.65 on does: time passing, dead letters, window changes, gaps."""
        rng = self.rng
        if roll < 0.78:
            self.now += rng.choice([1, 10, 60, 250, 600])
            if rng.random() < 0.5:
                self.tick()
        elif roll < 0.86:
            self.dead_letters()
            self.publish_dead_letters(fail=rng.random() < 0.3)
        elif roll < 0.89:
            self.set_window(rng.choice(WINDOWS))
        elif roll < 0.89 + self.gap_rate:
            if rng.random() < 0.6:
                self.skip()
            else:
                self.read_with_holes()

    def ack_all(self, ds: list[Delivery]) -> None:
        if self.quiesce_mode == "single" or not ds:
            for d in ds:
                self.received[d.consumer_id].remove(d.offset)
                self.checked_ack(d.offset)
        elif self.quiesce_mode == "range":
            self.checked_ack_range(min(d.offset for d in ds), max(d.offset for d in ds))
        else:
            for cid in sorted({d.consumer_id for d in ds}):
                self.checked_ack_upto(cid, max(d.offset for d in ds if d.consumer_id == cid))

    def quiesce(self) -> None:
        s = self.s
        if self.sub_type is SubType.EXCLUSIVE and self.attached:
            pass  # keep the current holder
        else:
            self.attach(FINAL_CONSUMER, ())
        unblocked = False
        for _ in range(2_000):
            ds = self.poll()
            self.after_step()
            self.ack_all(ds)
            resolved = len(self.dead_lettered)
            self.dead_letters()
            self.publish_dead_letters(fail=False)
            self.after_step()
            if not self.unresolved:
                break
            if ds or resolved != len(self.dead_lettered):
                continue  # acks and publishes may have released keys: poll again before waiting
            wake = s.next_wakeup()
            if wake is not None:
                self.now = max(self.now, wake)
                continue
            # Nothing is timed: only Block can leave messages behind, and only behind an exhausted one.
            self.check(self.policy.poison_policy == "Block", f"stuck: {sorted(self.unresolved)}")
            exhausted = [o for o in self.unresolved if s.state_of(o) is EntryState.EXHAUSTED]
            self.check(bool(exhausted) and not unblocked, "stuck without an exhausted message")
            for off in self.unresolved:
                if s.state_of(off) is EntryState.PENDING and self.sub_type is SubType.KEY_SHARED:
                    key = self.keys[off]
                    self.check(
                        any(self.keys[o] == key for o in exhausted if o < off), f"{off} held for no reason"
                    )
            for off in exhausted:  # a late ack of a blocked message is accepted and lifts the block
                self.checked_ack(off)
            self.after_step()
            unblocked = True
        else:
            raise SimFailure("did not quiesce")
        self.check(not s.held_offsets() and s.in_flight_count == 0, "window not empty")
        offered = set(self.keys)
        self.check(not any(self.in_gap(o) for o in offered), "an offset both offered and skipped")
        self.check(s.next_offset - self.start == len(offered) + self.skipped_total, "offered + skipped")
        fates = [self.acked, self.dead_lettered, self.dropped]
        self.check(set().union(*fates) == offered and sum(map(len, fates)) == len(offered), "fates")
        self.check(s.cursor == (s.next_offset - 1 if s.next_offset > self.start else None), "final cursor")
        if self.policy.poison_policy != "DeadLetter":
            self.check(not self.dead_lettered, "dead letters under another policy")
        stats = s.stats()
        self.check(stats.dropped_total == len(self.dropped), "dropped count")
        self.check(stats.dead_lettered_total == len(self.dead_lettered), "dead-lettered count")
        self.check(stats.acked_total == len(self.acked), "acked count")
        self.check(stats.skipped_total == self.skipped_total, "skipped count")


def run(sub_type: SubType, seed: int) -> None:
    sim = Sim(sub_type, seed)
    try:
        for _ in range(STEPS):
            sim.step()
            sim.after_step()
        sim.quiesce()
    except SimFailure as exc:
        raise AssertionError(f"{sub_type.name} seed={seed}: {exc} (policy={sim.policy})") from exc


@pytest.mark.parametrize("chunk", range(CHUNKS))
@pytest.mark.parametrize("sub_type", list(SubType), ids=lambda t: t.name)
def test_dispatch_simulation(sub_type: SubType, chunk: int) -> None:
    for seed in range(chunk * SEEDS_PER_CHUNK, (chunk + 1) * SEEDS_PER_CHUNK):
        run(sub_type, seed)
