"""One readiness condition, as the broker and the cluster report it (broker/health.py serves them)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Check:
    """One readiness condition: its name, whether it holds, and what a person needs to know."""

    name: str
    ok: bool
    detail: str = ""


ReadyProbe = Callable[[], Awaitable[Check | Sequence[Check]]]
