"""Connection plumbing shared by producers and consumers: channel options, URL parsing, retry policy."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

import grpc

from ister.limits import GRPC_MAX_MESSAGE_BYTES

CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_receive_message_length", GRPC_MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", GRPC_MAX_MESSAGE_BYTES),
    # Detect a dead broker on an open stream (the broker allows pings every 5 s or more).
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.http2.max_pings_without_data", 0),
    # Our own loops retry with backoff; gRPC's reconnect backoff (default up to 120 s) must not stack on it.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2_000),
    ("grpc.enable_retries", 0),
]


def open_channel(url: str) -> Any:
    """A grpc.aio channel for `http://host:port` (plain) or `https://host:port` (TLS with system roots)."""
    if url.startswith("https://"):
        return grpc.aio.secure_channel(
            url[len("https://") :].rstrip("/"), grpc.ssl_channel_credentials(), options=CHANNEL_OPTIONS
        )
    target = url[len("http://") :] if url.startswith("http://") else url
    return grpc.aio.insecure_channel(target.rstrip("/"), options=CHANNEL_OPTIONS)


def normalize_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = f"http://{url}"
    return url


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Bounded retries: attempt n (1-based) waits min(max, base * 2**(n-1)) scaled by a jitter in [0.5, 1].

    A series of retries ends after `timeout` seconds since its first failure, or after `max_retries`
    retries when that is set, whichever comes first."""

    max_retries: int | None = None
    base: float = 0.2
    max: float = 2.0
    timeout: float = 30.0

    def delay(self, attempt: int) -> float:
        d: float = min(self.max, self.base * (2.0 ** max(0, attempt - 1)))
        return d * (0.5 + random.random() / 2)


class RetryBudget:
    """One series of retries of a failing operation under a `RetryPolicy`: `next_delay()` after each
    failure says how long to wait before the next attempt, or None when the budget is spent; `reset()`
    after a success (or progress) starts a fresh series."""

    __slots__ = ("attempts", "policy", "started")

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self.attempts = 0
        self.started: float | None = None

    def reset(self) -> None:
        self.attempts = 0
        self.started = None

    @property
    def elapsed(self) -> float:
        return 0.0 if self.started is None else time.monotonic() - self.started

    def next_delay(self) -> float | None:
        now = time.monotonic()
        if self.started is None:
            self.started = now
        self.attempts += 1
        policy = self.policy
        left = policy.timeout - (now - self.started)
        if left <= 0 or (policy.max_retries is not None and self.attempts > policy.max_retries):
            return None
        return min(policy.delay(self.attempts), left)

    def spent(self, what: str, err: BaseException) -> str:
        """The message of the error that ends the series."""
        return f"{what}: gave up after {self.attempts} attempts in {self.elapsed:.1f} s: {err}"
