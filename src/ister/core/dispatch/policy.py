"""The per-subscription failure policy: ack timeout, redelivery backoff and what to do with poison messages.

JSON keys and value spellings follow Danube's `failure_policy` record, so a policy stored by either broker
reads back in the other. Ister's default poison policy is DeadLetter (Danube's is Block); with no
`dead_letter_topic` the broker uses `<topic>-DLQ`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ister.errors import InvalidArgument
from ister.ids import shown

U32_MAX = 2**32 - 1
U63_MAX = 2**63 - 1
MAX_DLQ_TOPIC_LEN = 512


BackoffStrategy = Literal["Exponential", "Fixed"]
PoisonPolicy = Literal["DeadLetter", "Drop", "Block"]

FIXED: BackoffStrategy = "Fixed"
EXPONENTIAL: BackoffStrategy = "Exponential"
DEAD_LETTER: PoisonPolicy = "DeadLetter"
DROP: PoisonPolicy = "Drop"
BLOCK: PoisonPolicy = "Block"

# Accepted spellings when reading: Danube's JSON names and its admin CLI's lower-case forms.
_BACKOFF_NAMES: dict[str, BackoffStrategy] = {"fixed": FIXED, "exponential": EXPONENTIAL}
_POISON_NAMES: dict[str, PoisonPolicy] = {
    "deadletter": DEAD_LETTER,
    "dead_letter": DEAD_LETTER,
    "drop": DROP,
    "block": BLOCK,
}


def _int_field(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"failure policy: {name} must be an integer, got {shown(value)}")
    if not low <= value <= high:
        raise InvalidArgument(f"failure policy: {name} must be in {low}..{high}, got {value}")
    return value


def _parse_backoff(value: object) -> BackoffStrategy:
    if isinstance(value, str) and value.lower() in _BACKOFF_NAMES:
        return _BACKOFF_NAMES[value.lower()]
    raise InvalidArgument(
        f"failure policy: backoff_strategy must be 'Fixed' or 'Exponential', got {shown(value)}"
    )


def _parse_poison(value: object) -> PoisonPolicy:
    if isinstance(value, str) and value.lower() in _POISON_NAMES:
        return _POISON_NAMES[value.lower()]
    raise InvalidArgument(
        f"failure policy: poison_policy must be 'DeadLetter', 'Drop' or 'Block', got {shown(value)}"
    )


@dataclass(frozen=True, slots=True)
class FailurePolicy:
    """How a reliable subscription treats unacknowledged messages. Validated on construction.

    `backoff` and `poison_policy` hold the canonical JSON spellings; the CLI's lower-case forms
    ("fixed", "dead_letter", ...) are accepted and normalised.
    """

    max_redelivery_count: int = 5
    ack_timeout_ms: int = 30_000
    base_redelivery_delay_ms: int = 1_000
    max_redelivery_delay_ms: int = 60_000
    backoff: BackoffStrategy = EXPONENTIAL
    poison_policy: PoisonPolicy = DEAD_LETTER
    dead_letter_topic: str | None = None

    def __post_init__(self) -> None:
        _int_field("max_redelivery_count", self.max_redelivery_count, 0, U32_MAX)
        _int_field("ack_timeout_ms", self.ack_timeout_ms, 1, U63_MAX)
        _int_field("base_redelivery_delay_ms", self.base_redelivery_delay_ms, 0, U63_MAX)
        _int_field("max_redelivery_delay_ms", self.max_redelivery_delay_ms, 0, U63_MAX)
        # Normalise CLI spellings ("fixed", "drop", ...) to the canonical ones (frozen: object.__setattr__).
        object.__setattr__(self, "backoff", _parse_backoff(self.backoff))
        object.__setattr__(self, "poison_policy", _parse_poison(self.poison_policy))
        dlq = self.dead_letter_topic
        if dlq is not None:
            if not isinstance(dlq, str) or not dlq.strip():
                raise InvalidArgument(
                    f"failure policy: dead_letter_topic must be a non-blank string, got {shown(dlq)}"
                )
            if len(dlq) > MAX_DLQ_TOPIC_LEN:
                raise InvalidArgument(f"failure policy: dead_letter_topic longer than {MAX_DLQ_TOPIC_LEN}")

    @property
    def backoff_strategy(self) -> BackoffStrategy:
        """Alias of `backoff`, named as the JSON key."""
        return self.backoff

    def retry_delay_ms(self, failures: int, requested_delay_ms: int | None = None) -> int:
        """Delay before the retry that follows the `failures`-th failed delivery (1-based).

        Fixed: base. Exponential: base * 2^(failures-1). A client's nack delay can only lengthen it, and the
        maximum caps both: min(max(policy, requested or 0), max_redelivery_delay_ms).
        """
        k = max(1, failures)
        base = self.base_redelivery_delay_ms
        if self.backoff == FIXED or base == 0:
            policy_delay = base
        else:
            shift = k - 1
            policy_delay = self.max_redelivery_delay_ms if shift >= 64 else base << shift
        requested = requested_delay_ms if requested_delay_ms is not None and requested_delay_ms > 0 else 0
        return min(max(policy_delay, requested), self.max_redelivery_delay_ms)

    def is_exhausted(self, failures: int) -> bool:
        """True once a message has failed more often than redeliveries allow (max_redelivery_count + 1)."""
        return failures > self.max_redelivery_count

    def to_json(self) -> dict[str, Any]:
        return {
            "max_redelivery_count": self.max_redelivery_count,
            "ack_timeout_ms": self.ack_timeout_ms,
            "base_redelivery_delay_ms": self.base_redelivery_delay_ms,
            "max_redelivery_delay_ms": self.max_redelivery_delay_ms,
            "backoff_strategy": self.backoff,
            "dead_letter_topic": self.dead_letter_topic,
            "poison_policy": self.poison_policy,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FailurePolicy:
        """Build from a decoded JSON object; missing keys take the defaults, unknown keys are ignored."""
        if not isinstance(data, Mapping):
            raise InvalidArgument(f"failure policy must be a JSON object, got {type(data).__name__}")
        default = cls()
        dlq = data.get("dead_letter_topic")
        if dlq is not None and not isinstance(dlq, str):
            raise InvalidArgument(
                f"failure policy: dead_letter_topic must be a string or null, got {shown(dlq)}"
            )
        return cls(
            max_redelivery_count=data.get("max_redelivery_count", default.max_redelivery_count),
            ack_timeout_ms=data.get("ack_timeout_ms", default.ack_timeout_ms),
            base_redelivery_delay_ms=data.get("base_redelivery_delay_ms", default.base_redelivery_delay_ms),
            max_redelivery_delay_ms=data.get("max_redelivery_delay_ms", default.max_redelivery_delay_ms),
            backoff=_parse_backoff(data.get("backoff_strategy", default.backoff)),
            poison_policy=_parse_poison(data.get("poison_policy", default.poison_policy)),
            dead_letter_topic=dlq,
        )
