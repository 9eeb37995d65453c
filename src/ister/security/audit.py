"""The audit log: one structured line per admin change and per refused call, on logger `ister.audit`.

A line is `audit principal=… action=… resource=… result=…` (values JSON-quoted when they hold spaces or
quotes). At most `max_per_second` lines a second are written; the ones beyond are counted and the next
line written says how many were dropped. Tokens and other secrets never appear in it.
"""

from __future__ import annotations

import json
import logging
import time

log = logging.getLogger("ister.audit")


def _value(text: str) -> str:
    text = text[:256]
    if text and all(c.isalnum() or c in "_-./:@*" for c in text):
        return text
    return json.dumps(text)


class AuditLog:
    def __init__(self, max_per_second: int, enabled: bool = True, clock: object = time.monotonic) -> None:
        self.enabled = enabled
        self.max_per_second = max_per_second
        self._clock = clock
        self._window = -1
        self._count = 0
        self.dropped = 0

    def record(self, principal: str, action: str, resource: str, result: str) -> None:
        if not self.enabled:
            return
        window = int(self._clock())  # type: ignore[operator]
        if window != self._window:
            self._window, self._count = window, 0
        if self._count >= self.max_per_second:
            self.dropped += 1
            return
        self._count += 1
        tail = f" dropped_before={self.dropped}" if self.dropped else ""
        self.dropped = 0
        log.info(
            "audit principal=%s action=%s resource=%s result=%s%s",
            _value(principal),
            _value(action),
            _value(resource),
            _value(result),
            tail,
        )
