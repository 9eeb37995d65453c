"""A Spark executor reading a durable object of records compressed with a zstd dictionary it does not hold
(dictionaries live in the brokers' metadata) reads that part from the broker instead (spark/ranges.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from ister.benchmark.payloads import log_lines
from ister.core import zdict
from ister.core.compression import Codec, missing_dictionary, wrap, wrap_with_dictionary
from ister.core.record import StoredMessage, encode_message
from ister.core.stream_offsets import TopicPartition
from ister.spark import ranges
from ister.spark.ranges import OffsetRange, read_raw

LINES = log_lines(300)
PLAIN = [encode_message(StoredMessage(p, 1_767_000_000_000 + o, 7, "p")) for o, p in enumerate(LINES)]


class Broker:
    """The broker's Read: plain records (it decompresses those with a dictionary)."""

    def __init__(self) -> None:
        self.reads: list[tuple[int, int]] = []

    def read(self, topic: str, start: int, end: int, max_records: int = 10_000) -> Iterator[list[Any]]:
        self.reads.append((start, end))
        yield [(o, PLAIN[o]) for o in range(start, end)]


def test_unknown_dictionaries_are_read_through_the_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    private = zdict.DictionaryRegistry()  # the broker's, not this process's
    dict_id = private.add(zdict.train(PLAIN, 555_002))
    assert dict_id not in zdict.REGISTRY
    stored = [wrap(Codec.ZSTD, r) for r in PLAIN[:100]] + [
        wrap_with_dictionary(dict_id, r, private) for r in PLAIN[100:]
    ]
    assert not missing_dictionary(stored[0]) and missing_dictionary(stored[150])
    assert not missing_dictionary(stored[150], private)

    async def runs(store: Any, key: str, lo: int, hi: int) -> AsyncIterator[tuple[int, list[bytes]]]:
        first, last = (0, 99) if key == "a" else (100, 299)
        for start in range(max(lo, first), min(hi, last) + 1, 50):
            yield start, stored[start : min(start + 50, last + 1, hi + 1)]

    broker = Broker()
    monkeypatch.setattr(ranges, "open_store", lambda url, options: object())
    monkeypatch.setattr(ranges, "read_segment_runs", runs)
    monkeypatch.setattr(ranges, "shared_client", lambda *a: broker)
    part = OffsetRange(
        TopicPartition("/default/t", 0),
        20,
        300,
        "http://b",
        5.0,
        False,
        1000,
        objects=[(0, 99, "a"), (100, 299, "b")],
        storage_url="s3://x",
    )
    rows = [r for batch in read_raw(part) for r in batch.to_pylist()]
    assert [r["offset"] for r in rows] == list(range(20, 300))
    assert [r["value"] for r in rows] == LINES[20:]
    assert broker.reads == [(100, 300)]  # the object's first run holds dictionary records: from there on
