"""Failed moves: the note an owner leaves when it cannot seal a topic, and how long the load manager waits.

A move hands a topic off only once everything acknowledged is readable by the next owner (docs/architecture.md
§12, "Unload / move"). When the owner cannot make it so (no durable tier, the object store down), the topic
stays where it is and the owner records why; the load manager then leaves the topic alone for a backoff that
doubles with each failure in a row, and a successful move clears the note.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from ister.core.backoff import Backoff

BASE_BACKOFF_SECONDS = 60.0
MAX_BACKOFF_SECONDS = 3600.0
MOVE_BACKOFF = Backoff(first=BASE_BACKOFF_SECONDS, cap=MAX_BACKOFF_SECONDS)
MAX_CAUSE_CHARS = 400

Code = Literal["unavailable", "failed_precondition"]


class MoveFailure(msgspec.Struct, frozen=True, kw_only=True):
    from_broker: int
    cause: str
    code: Code = "unavailable"  # unavailable: may work later (store down); failed_precondition: not as set up
    at: float  # unix seconds
    failures: int = 1  # failed moves in a row

    @classmethod
    def parse(cls, value: Any) -> MoveFailure | None:
        try:
            note = msgspec.convert(value, cls)
        except msgspec.ValidationError:
            return None
        return note if note.failures >= 1 and note.from_broker >= 0 else None

    def to_json(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)  # type: ignore[no-any-return]


def next_failure(
    previous: MoveFailure | None, broker: int, cause: str, code: Code, now: float
) -> MoveFailure:
    """The note after one more failed move (the count restarts when another broker failed before)."""
    count = previous.failures + 1 if previous is not None and previous.from_broker == broker else 1
    if len(cause) > MAX_CAUSE_CHARS:
        cause = cause[: MAX_CAUSE_CHARS - 1] + "…"
    return MoveFailure(from_broker=broker, cause=cause, code=code, at=now, failures=count)


def backoff_seconds(failures: int) -> float:
    return MOVE_BACKOFF.delay(failures)


def backing_off(note: MoveFailure, now: float) -> bool:
    """Whether the load manager should still leave the topic where it is."""
    return now < note.at + backoff_seconds(note.failures)
