"""Server-side search, sort and paging of the topic list (pure: unit-tested without a broker)."""

from __future__ import annotations

from dataclasses import dataclass

SORT_KEYS = ("name", "broker", "delivery")
MAX_PAGE_SIZE = 500


@dataclass(frozen=True)
class TopicRow:
    name: str
    broker_id: str
    delivery: str


@dataclass(frozen=True)
class Page:
    rows: list[TopicRow]
    total: int  # rows matching the search, over all pages
    page: int  # 1-based, clamped to the pages there are
    pages: int


def page_of(
    rows: list[TopicRow],
    query: str = "",
    sort: str = "name",
    desc: bool = False,
    page: int = 1,
    size: int = 50,
) -> Page:
    """The `page`-th `size` rows whose name contains `query` (case-insensitive), sorted by `sort`.
    An unknown sort key or a bad page/size is a ValueError: the caller answers 400, nothing is guessed."""
    if sort not in SORT_KEYS:
        raise ValueError(f"sort must be one of {', '.join(SORT_KEYS)}, not {sort!r}")
    if not 1 <= size <= MAX_PAGE_SIZE:
        raise ValueError(f"page size must be 1..{MAX_PAGE_SIZE}, not {size}")
    if page < 1:
        raise ValueError(f"page must be 1 or more, not {page}")
    needle = query.strip().lower()
    matched = [r for r in rows if needle in r.name.lower()] if needle else list(rows)
    key = {
        "name": lambda r: r.name,
        "broker": lambda r: (r.broker_id, r.name),
        "delivery": lambda r: (r.delivery, r.name),
    }[sort]
    matched.sort(key=key, reverse=desc)
    pages = max(1, -(-len(matched) // size))
    page = min(page, pages)
    start = (page - 1) * size
    return Page(matched[start : start + size], len(matched), page, pages)
