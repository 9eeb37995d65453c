"""The topic list's paging parameters (pure); the broker's filter, sort and paging are
tests/unit/test_topic_listing.py's, and the console's pages over 300 and 10,000 topics the HTTP and
browser tests'."""

from __future__ import annotations

import pytest

from ister.console.paging import MAX_PAGE_SIZE, check, pages_of


def test_pages_count_every_row_once() -> None:
    assert [pages_of(n, 50) for n in (0, 1, 50, 51, 120)] == [1, 1, 1, 2, 3]


@pytest.mark.parametrize(
    ("sort", "page", "size", "words"),
    [
        ("owner", 1, 50, "sort must be one of"),
        ("name", 1, 0, "page size must be"),
        ("name", 1, MAX_PAGE_SIZE + 1, "page size must be"),
        ("broker", 0, 50, "page must be 1 or more"),
    ],
)
def test_bad_paging_input_is_a_clear_error(sort: str, page: int, size: int, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        check(sort, page, size)
    check("delivery", 1, MAX_PAGE_SIZE)  # the bounds themselves are fine
