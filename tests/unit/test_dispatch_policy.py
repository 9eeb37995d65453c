from __future__ import annotations

from typing import Any

import pytest

from ister.core.dispatch import FailurePolicy
from ister.errors import InvalidArgument


def test_defaults() -> None:
    p = FailurePolicy()
    assert (p.max_redelivery_count, p.ack_timeout_ms) == (5, 30_000)
    assert (p.base_redelivery_delay_ms, p.max_redelivery_delay_ms) == (1_000, 60_000)
    assert p.backoff_strategy == "Exponential" and p.backoff == "Exponential"
    assert p.poison_policy == "DeadLetter"
    assert p.dead_letter_topic is None


def test_exponential_delays() -> None:
    p = FailurePolicy()
    assert [p.retry_delay_ms(k) for k in range(1, 9)] == [1000, 2000, 4000, 8000, 16000, 32000, 60000, 60000]
    assert p.retry_delay_ms(10_000) == 60_000


def test_fixed_delay_is_a_minimum_and_client_can_only_lengthen() -> None:
    p = FailurePolicy(backoff="Fixed")
    assert p.retry_delay_ms(1) == 1000 and p.retry_delay_ms(7) == 1000
    assert p.retry_delay_ms(1, 0) == 1000
    assert p.retry_delay_ms(1, 200) == 1000
    assert p.retry_delay_ms(1, 2500) == 2500
    assert p.retry_delay_ms(1, 10**9) == 60_000
    assert p.retry_delay_ms(1, -5) == 1000


def test_exponential_capped_by_max() -> None:
    p = FailurePolicy(base_redelivery_delay_ms=1000, max_redelivery_delay_ms=2500)
    assert [p.retry_delay_ms(k) for k in (1, 2, 3, 4)] == [1000, 2000, 2500, 2500]


def test_exhaustion_threshold() -> None:
    assert FailurePolicy(max_redelivery_count=0).is_exhausted(1)
    p = FailurePolicy(max_redelivery_count=1)
    assert not p.is_exhausted(1) and p.is_exhausted(2)


def test_json_round_trip_uses_danube_keys() -> None:
    p = FailurePolicy(
        max_redelivery_count=2,
        ack_timeout_ms=200,
        base_redelivery_delay_ms=50,
        max_redelivery_delay_ms=50,
        backoff="Fixed",
        poison_policy="Block",
        dead_letter_topic="/default/t-dlq",
    )
    data = p.to_json()
    assert data == {
        "max_redelivery_count": 2,
        "ack_timeout_ms": 200,
        "base_redelivery_delay_ms": 50,
        "max_redelivery_delay_ms": 50,
        "backoff_strategy": "Fixed",
        "dead_letter_topic": "/default/t-dlq",
        "poison_policy": "Block",
    }
    assert FailurePolicy.from_json(data) == p
    assert FailurePolicy.from_json(FailurePolicy().to_json()) == FailurePolicy()


def test_from_json_accepts_cli_spellings_and_fills_defaults() -> None:
    p = FailurePolicy.from_json({"backoff_strategy": "fixed", "poison_policy": "dead_letter", "extra": 1})
    assert p.backoff_strategy == "Fixed"
    assert p.poison_policy == "DeadLetter"
    assert p.max_redelivery_count == 5
    assert FailurePolicy(poison_policy="drop").poison_policy == "Drop"  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "data",
    [
        {"max_redelivery_count": -1},
        {"max_redelivery_count": 2**32},
        {"max_redelivery_count": "5"},
        {"max_redelivery_count": True},
        {"ack_timeout_ms": 0},
        {"ack_timeout_ms": 1.5},
        {"base_redelivery_delay_ms": -1},
        {"max_redelivery_delay_ms": None},
        {"backoff_strategy": "Linear"},
        {"backoff_strategy": 1},
        {"poison_policy": "Retry"},
        {"dead_letter_topic": "   "},
        {"dead_letter_topic": 5},
        {"dead_letter_topic": "x" * 1000},
    ],
)
def test_from_json_rejects_bad_values(data: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument):
        FailurePolicy.from_json(data)


def test_from_json_rejects_non_object() -> None:
    with pytest.raises(InvalidArgument):
        FailurePolicy.from_json([1, 2])  # type: ignore[arg-type]
