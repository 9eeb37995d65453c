"""`core.rate_limit`: token buckets on a clock reading given as an argument (no real time anywhere)."""

from __future__ import annotations

import random

import pytest

from ister.core.rate_limit import Rate, RateLimiter, TokenBucket


def test_a_new_bucket_is_full_then_paces_at_its_rate() -> None:
    b = TokenBucket(10, now=0.0)
    assert [b.reserve(1, 0.0) for _ in range(10)] == [0.0] * 10  # the burst: one second's worth
    assert b.reserve(1, 0.0) == pytest.approx(0.1)  # the 11th waits for one token
    assert b.reserve(1, 0.0) == pytest.approx(0.2)  # and the next behind it
    assert b.tokens(0.3) == pytest.approx(1.0)  # debt of 2 repaid after 0.2 s, one more token since


def test_three_seconds_worth_takes_two_seconds_after_the_burst() -> None:
    b = TokenBucket(50, now=100.0)
    waits = [b.reserve(1, 100.0) for _ in range(150)]
    assert max(waits) == pytest.approx(2.0)  # the last of 3N messages goes 2 s later
    assert waits == sorted(waits)  # turns in the order they were taken


def test_max_wait_refuses_and_takes_nothing() -> None:
    b = TokenBucket(10, now=0.0)
    assert b.reserve(10, 0.0) == 0.0
    assert b.reserve(30, 0.0, max_wait=0.5) is None  # would wait 1 s for a full bucket: refused
    assert b.tokens(0.0) == 0.0  # nothing was taken
    assert b.reserve(5, 0.0, max_wait=1.0) == pytest.approx(0.5)


def test_a_request_larger_than_the_burst_is_admitted_against_a_full_bucket() -> None:
    b = TokenBucket(10, now=0.0)
    assert b.reserve(25, 0.0) == 0.0  # never refused for its size alone
    assert b.reserve(1, 0.0) == pytest.approx(1.6)  # the debt of 15 (+1) is paid before the next


def test_zero_is_unlimited_and_a_limit_set_later_starts_full() -> None:
    b = TokenBucket(0, now=0.0)
    assert all(b.reserve(1_000_000, 0.0) == 0.0 for _ in range(10))
    b.configure(5, now=1.0)
    assert [b.reserve(1, 1.0) for _ in range(5)] == [0.0] * 5
    assert b.reserve(1, 1.0) == pytest.approx(0.2)


def test_raising_the_rate_at_run_time_shortens_the_wait() -> None:
    b = TokenBucket(1, now=0.0)
    b.reserve(1, 0.0)
    assert b.delay_for(1, 0.0) == pytest.approx(1.0)
    b.configure(100, now=0.0)
    assert b.delay_for(1, 0.0) == pytest.approx(0.01)
    b.configure(0, now=0.0)  # lifted
    assert b.reserve(10**9, 0.0) == 0.0


def test_bad_rates_are_refused() -> None:
    with pytest.raises(ValueError):
        TokenBucket(-1, now=0.0)
    with pytest.raises(ValueError):
        TokenBucket(1, now=0.0, burst=-1)


def test_messages_and_bytes_the_slower_one_decides_and_is_named() -> None:
    lim = RateLimiter(Rate(messages=100, bytes=1_000), now=0.0)
    assert lim.admit(10, 1_000, 0.0) == (0.0, "")  # both buckets had room
    wait, which = lim.admit(1, 500, 0.0)
    assert which == "" and wait == pytest.approx(0.5)  # bytes are the limit here
    assert lim.admit(1, 10_000, 0.0, max_wait=1.0) == (None, "bytes")  # 1.5 s to a full bucket
    assert lim.admit(1, 10_000, 0.0, max_wait=2.0) == (pytest.approx(1.5), "")  # then 10 s of debt
    lim = RateLimiter(Rate(messages=2), now=0.0)
    lim.admit(2, 0, 0.0)
    assert lim.admit(100, 0, 0.0, max_wait=0.5) == (None, "messages")
    assert Rate().unlimited and not Rate(bytes=1).unlimited


@pytest.mark.parametrize("seed", range(10))
def test_seeded_producers_never_beat_the_rate(seed: int) -> None:
    """Producers with random batch sizes and random think times, each acting when its wait ends: in every
    window of T seconds at most burst + rate * T messages go (plus the one batch that may overdraw)."""
    rng = random.Random(seed)
    rate = rng.choice([5, 50, 500])
    b = TokenBucket(rate, now=0.0)
    sent: list[tuple[float, int]] = []
    at = [rng.uniform(0, 1) for _ in range(4)]  # each producer's next attempt
    biggest = 0
    for _ in range(2_000):
        i = min(range(len(at)), key=at.__getitem__)
        now = at[i]
        n = rng.randint(1, max(1, rate // 3))
        biggest = max(biggest, n)
        wait = b.reserve(n, now)
        assert wait is not None and wait >= 0
        sent.append((now + wait, n))
        at[i] = now + wait + rng.uniform(0, 0.01)
    sent.sort()
    times = [t for t, _ in sent]
    for window in (0.5, 1.0, 5.0):
        j = total = 0
        for k, (t, n) in enumerate(sent):
            total += n
            while times[j] < t - window:
                total -= sent[j][1]
                j += 1
            assert total <= rate + rate * window + biggest + 1e-6, (k, window)
    span = times[-1] - times[0]
    assert sum(n for _, n in sent) <= rate * span + rate + biggest  # the average is the rate, at most
    assert sum(n for _, n in sent) >= rate * span * 0.9  # and producers that keep asking get close to it
