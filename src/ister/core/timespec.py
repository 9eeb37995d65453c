"""Points in time as people write them on a command line (`--time`): ISO 8601, relative, or Unix ms."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from ister.errors import InvalidArgument

_RELATIVE = re.compile(r"^-(\d{1,9})(ms|s|m|h|d|w)$")
UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
MAX_TIME_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z


def parse_time(text: str, now_ms: int) -> int:
    """Unix ms of `text`:

    - ISO 8601: `2026-12-01T10:00:00Z`, `2026-12-01T11:00:00+01:00`, `2026-12-01` (a time without a zone
      is UTC);
    - relative to `now_ms`: `-30m`, `-45s`, `-2h`, `-7d`, `-1w`, `-500ms`;
    - a number: Unix milliseconds.
    """
    raw = text.strip()
    if not raw:
        raise InvalidArgument("empty time: use 2026-12-01T10:00:00Z, -30m or Unix milliseconds")
    rel = _RELATIVE.match(raw)
    if rel is not None:
        value = now_ms - int(rel.group(1)) * UNIT_MS[rel.group(2)]
    elif raw.isascii() and raw.isdigit():
        value = int(raw)
    else:
        try:
            when = datetime.fromisoformat(raw.replace("z", "Z"))
        except ValueError:
            raise InvalidArgument(
                f"cannot read the time {raw[:64]!r}: use 2026-12-01T10:00:00Z, -30m (s, m, h, d, w) or Unix "
                "milliseconds"
            ) from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        value = int(when.timestamp() * 1000)
    if not 0 <= value <= MAX_TIME_MS:
        raise InvalidArgument(f"the time {raw[:64]!r} is not between 1970 and the year 9999")
    return value


def format_time(ms: int) -> str:
    """`2026-12-01T10:00:00.123Z`."""
    when = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"
