"""Pure offset arithmetic and option parsing of the Spark connector (no Spark, no broker)."""

from __future__ import annotations

import random

import pytest

from ister.core import stream_offsets as so
from ister.core.stream_offsets import TopicPartition as TP
from ister.errors import InvalidArgument
from ister.spark.options import SinkOptions, SourceOptions


def test_topic_partition_names_round_trip() -> None:
    assert TP.of("/default/t") == TP("/default/t", -1)
    assert TP.of("/default/t-part-3") == TP("/default/t", 3)
    assert TP("/default/t", 3).name == "/default/t-part-3"
    assert TP("/default/t", -1).name == "/default/t"


def test_parse_spec_accepts_keywords_and_json() -> None:
    assert so.parse_spec(None, "startingOffsets", default="earliest") == "earliest"
    assert so.parse_spec(" LATEST ", "startingOffsets", default="earliest") == "latest"
    spec = so.parse_spec('{"/default/t": {"0": 5, "1": -2}, "/default/u": {"-1": -1}}', "x", default="latest")
    assert spec == {"/default/t": {"0": 5, "1": -2}, "/default/u": {"-1": -1}}


@pytest.mark.parametrize(
    "raw",
    ["nope", "[1]", '{"/default/t": 3}', '{"/default/t": {}}', '{"/default/t": {"x": 1}}',
     '{"/default/t": {"0": -3}}', '{"/default/t": {"0": true}}', '{"bad name": {"0": 1}}'],
)  # fmt: skip
def test_parse_spec_rejects_bad_input(raw: str) -> None:
    with pytest.raises(InvalidArgument):
        so.parse_spec(raw, "startingOffsets", default="latest")


def test_ending_offsets_refuse_earliest() -> None:
    with pytest.raises(InvalidArgument, match="not allowed"):
        so.parse_spec('{"/default/t": {"0": -2}}', "endingOffsets", default="latest", allow_earliest=False)


def test_resolve_uses_json_then_the_default_for_missing_partitions() -> None:
    spec = so.parse_spec('{"/default/t": {"0": 7, "1": -2, "2": -1}}', "x", default="latest")
    tp = TP("/default/t", 0)
    assert so.resolve(spec, tp, 3, 100, missing="latest") == 7
    assert so.resolve(spec, TP("/default/t", 1), 3, 100, missing="latest") == 3
    assert so.resolve(spec, TP("/default/t", 2), 3, 100, missing="earliest") == 100
    assert so.resolve(spec, TP("/default/t", 9), 3, 100, missing="earliest") == 3
    assert so.resolve("latest", tp, 3, 100, missing="earliest") == 100


def test_cap_splits_in_proportion_and_never_starves() -> None:
    a, b, c = TP("/d/a", -1), TP("/d/b", -1), TP("/d/c", -1)
    start = {a: 0, b: 0, c: 0}
    end = so.cap(start, {a: 900, b: 90, c: 10}, 100)
    assert sum(end[t] - start[t] for t in end) == 100
    assert end[a] >= 85 and end[b] >= 8 and end[c] >= 1
    assert so.cap(start, {a: 5, b: 5, c: 0}, 100) == {a: 5, b: 5, c: 0}  # under the cap: everything


def test_cap_is_exact_and_bounded_for_random_backlogs() -> None:
    rng = random.Random(7)
    for _ in range(500):
        tps = [TP(f"/d/t{i}", -1) for i in range(rng.randint(1, 6))]
        start = {t: rng.randint(0, 1000) for t in tps}
        end = {t: start[t] + rng.choice([0, rng.randint(0, 5000)]) for t in tps}
        limit = rng.randint(1, 3000)
        got = so.cap(start, end, limit)
        taken = sum(got[t] - start[t] for t in tps)
        assert taken == min(limit, sum(end[t] - start[t] for t in tps))
        assert all(start[t] <= got[t] <= end[t] for t in tps)
        if limit >= len(tps):
            assert all(got[t] > start[t] for t in tps if end[t] > start[t])


def test_split_and_plan_ranges_cover_every_offset_once() -> None:
    assert so.split(10, 20, 3) == [(10, 14), (14, 17), (17, 20)]
    assert so.split(5, 5, 3) == []
    assert so.split(0, 2, 8) == [(0, 1), (1, 2)]
    a, b = TP("/d/a", 0), TP("/d/a", 1)
    plan = so.plan_ranges({a: (0, 1000), b: (0, 100)}, min_partitions=11)
    assert len([p for p in plan if p[0] == a]) == 10 and len([p for p in plan if p[0] == b]) == 1
    plan = so.plan_ranges({a: (0, 1000), b: (50, 50)}, None, max_offsets_per_partition=300)
    assert [(s, e) for _, s, e in plan] == [(0, 250), (250, 500), (500, 750), (750, 1000)]


def test_source_options_validate() -> None:
    base = {"ister.service.url": "127.0.0.1:6650", "topic": "/default/t"}
    opts = SourceOptions.parse({**base, "includeHeaders": "true", "minPartitions": "4"}, streaming=False)
    assert opts.service_url == "http://127.0.0.1:6650" and opts.topics == ("/default/t",)
    assert opts.include_headers and opts.min_partitions == 4 and opts.starting == "earliest"
    assert SourceOptions.parse(base, streaming=True).starting == "latest"
    seeds = SourceOptions.parse({**base, "ister.service.url": "a:1, http://b:2"}, streaming=False)
    assert seeds.service_url == "http://a:1,http://b:2"
    storage = SourceOptions.parse({**base, "ister.storage.endpoint": "http://s3"}, streaming=False)
    assert storage.storage_options == {"endpoint": "http://s3"}
    bad = [
        ({"topic": "/default/t"}, "ister.service.url is required"),
        ({**base, "topics": "/default/u"}, "exactly one"),
        ({**base, "minPartitions": "0"}, "positive integer"),
        ({**base, "failOnDataLoss": "maybe"}, "true or false"),
        ({**base, "valueFormat": "registry"}, "raw or schema"),
        ({**base, "mode": "FAILFAST"}, "valueFormat=schema only"),
        ({**base, "valueFormat": "schema", "mode": "lenient"}, "PERMISSIVE"),
        ({**base, "valueFormat": "schema", "schemaVersion": "0"}, "positive integer"),
        ({**base, "maxOffsetsPerTrigger": "10"}, "streaming queries only"),
        ({**base, "typo": "1"}, "unknown source option"),
        ({"ister.service.url": "x", "topicsPattern": "/default/.*"}, "ister.admin.url"),
        ({"ister.service.url": "x", "topicsPattern": "(", "ister.admin.url": "a"}, "regular expression"),
    ]
    for options, message in bad:
        with pytest.raises(InvalidArgument, match=message):
            SourceOptions.parse(options, streaming=False)
    with pytest.raises(InvalidArgument, match="batch queries only"):
        SourceOptions.parse({**base, "endingOffsets": "latest"}, streaming=True)
    typed = SourceOptions.parse(
        {**base, "valueFormat": "Schema", "schemaSubject": "s", "schemaVersion": "2", "mode": "FailFast"},
        streaming=False,
    )
    assert typed.value.typed and typed.value.subject == "s" and typed.value.version == 2
    assert typed.value.mode == "failfast" and typed.value.corrupt_column == "_corrupt_record"
    assert not SourceOptions.parse(base, streaming=False).value.typed
    cursor = SourceOptions.parse({**base, "predefinedSubscription": "spark-lag"}, streaming=True)
    assert cursor.cursor_subscription == "spark-lag"
    assert SourceOptions.parse(base, streaming=True).cursor_subscription is None
    with pytest.raises(InvalidArgument, match="predefinedSubscription"):
        SourceOptions.parse({**base, "predefinedSubscription": "a/b"}, streaming=True)
    with pytest.raises(InvalidArgument, match="streaming queries only"):
        SourceOptions.parse({**base, "predefinedSubscription": "spark-lag"}, streaming=False)


def test_sink_options_validate() -> None:
    opts = SinkOptions.parse({"ister.service.url": "http://h:1", "topic": "/default/t"})
    assert opts.reliable and opts.idempotency_header and opts.topic == "/default/t"
    with pytest.raises(InvalidArgument, match="dispatchStrategy"):
        SinkOptions.parse({"ister.service.url": "http://h:1", "dispatchStrategy": "maybe"})
    assert opts.schema is None
    typed = SinkOptions.parse({"ister.service.url": "h:1", "schemaSubject": "s", "schemaType": "JSON"})
    assert typed.schema is not None and typed.schema.schema_type == "json_schema"
    with pytest.raises(InvalidArgument, match="needs the option schemaSubject"):
        SinkOptions.parse({"ister.service.url": "h:1", "schemaType": "avro"})
    with pytest.raises(InvalidArgument, match="schemaType"):
        SinkOptions.parse({"ister.service.url": "h:1", "schemaSubject": "s", "schemaType": "xml"})
