"""core.orphans: which listed files the sweep deletes."""

from __future__ import annotations

import pytest

from ister.core.orphans import ListedFile, orphans

NOW = 1_000_000.0
DAY = 86_400.0


def test_old_unreferenced_parquet_files_only() -> None:
    listed = [
        ListedFile("s3://b/t/data/old.parquet", NOW - 2 * DAY),  # orphan
        ListedFile("s3://b/t/data/named.parquet", NOW - 2 * DAY),  # a snapshot names it
        ListedFile("s3://b/t/data/young.parquet", NOW - 60),  # maybe a commit in flight
        ListedFile("s3://b/t/data/edge.parquet", NOW - DAY),  # exactly the minimum age: old enough
        ListedFile("s3://b/t/data/unknown.parquet", None),  # no modification time: age unknown
        ListedFile("s3://b/t/data/notes.txt", NOW - 9 * DAY),  # not a data file the writer makes
        ListedFile("s3://b/t/data/p=1/deep.parquet", NOW - 3 * DAY),  # a partition's directory
    ]
    got = orphans(listed, {"s3://b/t/data/named.parquet"}, NOW, DAY)
    assert got == [
        "s3://b/t/data/edge.parquet",
        "s3://b/t/data/old.parquet",
        "s3://b/t/data/p=1/deep.parquet",
    ]


def test_nothing_listed_or_everything_named() -> None:
    assert orphans([], set(), NOW, DAY) == []
    named = [ListedFile(f"f{i}.parquet", 0.0) for i in range(3)]
    assert orphans(named, {f.path for f in named}, NOW, DAY) == []


def test_min_age_zero_and_clock_behind_the_store() -> None:
    f = ListedFile("a.parquet", NOW)
    assert orphans([f], set(), NOW, 0) == ["a.parquet"]
    # the store's clock ahead of ours: a file "from the future" is young, kept
    assert orphans([ListedFile("b.parquet", NOW + 30)], set(), NOW, 0) == []


def test_negative_min_age_is_refused() -> None:
    with pytest.raises(ValueError, match="min_age"):
        orphans([], set(), NOW, -1)
