"""Splitting what a log read returned into contiguous record runs and gaps (docs/architecture.md §12, "Gaps
never wedge").

A read from offset `expected_next` returns records with ascending offsets; where offsets are missing (a
dead broker's unexported tail, a damaged WAL range) the log has no records there. The broker feeds a
`ReliableSubscriptionState` run by run: `offer_batch` (or `offer`) for each record run and `skip` for each
gap, in the order `split_runs` returns them.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import count
from operator import eq


def split_runs(
    expected_next: int, offsets: Sequence[int], end: int | None = None
) -> list[tuple[int, int, bool]]:
    """(first, end, gap) items covering [expected_next, last offset + 1), in order, half-open.

    `gap` is True for a range with no records (call `skip(first, end)`) and False for a contiguous run of
    records (their offsets are first .. end - 1). `end`, when given, is where the read stopped (the log's
    next offset, or where the reader's range ends): a trailing range after the last record (or all of
    [expected_next, end) when `offsets` is empty) is a gap too. Raises ValueError unless the offsets are
    strictly ascending, none is below `expected_next`, and `end` (if given) is above the last one.
    """
    n = len(offsets)
    stop = expected_next if not n else offsets[-1] + 1
    if end is not None and end < stop:
        raise ValueError(f"read end {end} is below {stop}")
    out: list[tuple[int, int, bool]] = []
    if (
        n
        and offsets[0] == expected_next
        and stop - expected_next == n
        and all(map(eq, offsets, count(expected_next)))
    ):
        out.append((expected_next, stop, False))  # dense: the common case
    elif n:
        _split(expected_next, offsets, out)
    if end is not None and end > stop:
        out.append((stop, end, True))
    return out


def _split(expected_next: int, offsets: Sequence[int], out: list[tuple[int, int, bool]]) -> None:
    run_first = expected = expected_next
    for offset in offsets:
        if offset != expected:
            if offset < expected:
                raise ValueError(f"record offset {offset} out of order: expected {expected} or above")
            if expected > run_first:
                out.append((run_first, expected, False))
            out.append((expected, offset, True))
            run_first = offset
        expected = offset + 1
    out.append((run_first, expected, False))
