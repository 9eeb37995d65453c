"""`ister.spark.read`'s planning helpers and the internal ranges option (no Spark session needed)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("pyspark")

from ister.core.stream_offsets import TopicPartition
from ister.errors import InvalidArgument
from ister.spark.batch import _hadoop_base, _minus
from ister.spark.options import RANGES, SourceOptions


def test_minus_leaves_exactly_the_uncovered_offsets() -> None:
    assert _minus((0, 100), []) == [(0, 100)]
    assert _minus((0, 100), [(0, 100)]) == []
    assert _minus((0, 100), [(10, 20), (20, 30), (50, 60)]) == [(0, 10), (30, 50), (60, 100)]
    assert _minus((5, 25), [(0, 10), (20, 40)]) == [(10, 20)]


def test_hadoop_base() -> None:
    assert _hadoop_base("file:///data/objects/", None) == "file:///data/objects"
    assert _hadoop_base("s3://bucket/ister", None) is None
    assert _hadoop_base("s3://bucket/ister", "s3a://bucket/ister") == "s3a://bucket/ister"
    assert _hadoop_base(None, None) is None


def test_internal_ranges_option() -> None:
    base = {"ister.service.url": "http://127.0.0.1:6650", "topic": "/default/t"}
    spans = {"/default/t": {"-1": [[0, 10], [20, 30]]}, "/default/u": {"2": [[5, 6]]}}
    opts = SourceOptions.parse({**base, RANGES: json.dumps(spans)}, streaming=False)
    assert opts.ranges == {
        TopicPartition("/default/t", -1): [(0, 10), (20, 30)],
        TopicPartition("/default/u", 2): [(5, 6)],
    }
    assert opts.use_parquet and SourceOptions.parse(base, streaming=False).ranges is None
    with pytest.raises(InvalidArgument):
        SourceOptions.parse({**base, RANGES: "not json"}, streaming=False)
    with pytest.raises(InvalidArgument):
        SourceOptions.parse({**base, RANGES: json.dumps(spans)}, streaming=True)
    off = SourceOptions.parse({**base, "ister.read.parquet": "false"}, streaming=False)
    assert not off.use_parquet
