"""The topic list's search, sort and paging (pure)."""

from __future__ import annotations

import pytest

from ister.console.paging import MAX_PAGE_SIZE, TopicRow, page_of

ROWS = [
    TopicRow(f"/default/t{i:03d}", str(i % 3), "Reliable" if i % 2 else "NonReliable") for i in range(120)
]


def test_pages_cover_every_row_once_in_name_order() -> None:
    seen = [r.name for p in range(1, 4) for r in page_of(ROWS, page=p, size=50).rows]
    assert seen == sorted(r.name for r in ROWS)
    last = page_of(ROWS, page=3, size=50)
    assert (last.total, last.pages, len(last.rows)) == (120, 3, 20)


def test_search_is_a_case_insensitive_substring_and_counts_matches() -> None:
    page = page_of(ROWS, query="T01", size=500)
    assert page.total == 10 and all("t01" in r.name for r in page.rows)
    assert page_of(ROWS, query="nothing-like-this").total == 0


def test_sort_by_broker_descending_then_name() -> None:
    rows = page_of(ROWS, sort="broker", desc=True, size=500).rows
    assert [r.broker_id for r in rows[:40]] == ["2"] * 40
    assert rows[0].broker_id >= rows[-1].broker_id


def test_a_page_past_the_end_is_the_last_page() -> None:
    assert page_of(ROWS, page=99, size=50).page == 3


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"sort": "owner"}, "sort must be one of"),
        ({"size": 0}, "page size must be"),
        ({"size": MAX_PAGE_SIZE + 1}, "page size must be"),
        ({"page": 0}, "page must be 1 or more"),
    ],
)
def test_bad_paging_input_is_a_clear_error(kwargs: dict[str, object], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        page_of(ROWS, **kwargs)  # type: ignore[arg-type]
