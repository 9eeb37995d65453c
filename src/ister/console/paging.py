"""The topic list's paging parameters, checked before the broker is asked (IsterAdmin.ListTopics filters,
sorts and pages on the broker: the console never holds the whole list)."""

from __future__ import annotations

from dataclasses import dataclass

SORT_KEYS = ("name", "broker", "delivery")
MAX_PAGE_SIZE = 500


@dataclass(frozen=True)
class TopicRow:
    name: str
    broker_id: str  # empty: no owner now
    delivery: str


@dataclass(frozen=True)
class Page:
    rows: list[TopicRow]
    total: int  # rows matching the search, over all pages
    page: int  # 1-based, clamped to the pages there are
    pages: int


def check(sort: str, page: int, size: int) -> None:
    """An unknown sort key or a bad page/size is a ValueError: the caller answers 400, nothing is guessed."""
    if sort not in SORT_KEYS:
        raise ValueError(f"sort must be one of {', '.join(SORT_KEYS)}, not {sort!r}")
    if not 1 <= size <= MAX_PAGE_SIZE:
        raise ValueError(f"page size must be 1..{MAX_PAGE_SIZE}, not {size}")
    if page < 1:
        raise ValueError(f"page must be 1 or more, not {page}")


def pages_of(matched: int, size: int) -> int:
    """Pages of `size` rows for `matched` rows (at least one, empty)."""
    return max(1, -(-matched // size))
