"""The `ister` Spark source and sink against a real broker process and a real local[2] Spark."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ister.client.blocking import BlockingClient
from ister.spark.options import BATCH_HEADER
from ister.storage.objects.segment import parse_object_name
from tests.integration.harness import BrokerProcess, subscription_metric
from tests.support import until_sync

pytestmark = pytest.mark.timeout(300)
_seq = iter(range(10**6))


def new_topic(name: str) -> str:
    return f"/default/{name}_{next(_seq)}"


def produce(url: str, topic: str, start: int, count: int) -> list[int]:
    with BlockingClient(url) as client, client.producer(topic, reliable=True) as producer:
        futures = [
            producer.send_async(f"m{i:06d}".encode() + b"x" * 90, {"n": str(i)}, key=f"k{i % 5}")
            for i in range(start, start + count)
        ]
        return [f.result() for f in futures]


def objects_of(broker: BrokerProcess, topic: str) -> list[tuple[int, int]]:
    ns, name = topic.strip("/").split("/")
    found = [parse_object_name(p.name) for p in (broker.data_dir / "objects" / ns / name).glob("*.dnb1")]
    return sorted(r for r in found if r is not None)


def read(spark: Any, broker: BrokerProcess, topic: str, **options: str) -> Any:
    reader = spark.read.format("ister").option("ister.service.url", broker.url).option("topic", topic)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def test_batch_read_spans_objects_and_the_wal_tail(spark: Any, broker: BrokerProcess) -> None:
    topic = new_topic("batch")
    # In acknowledged chunks of 100 (~17 KiB): one write group never holds more, so the 32 KiB segments
    # rotate every few chunks however the writer groups them on a busy machine.
    offsets = [o for start in range(0, 3000, 100) for o in produce(broker.url, topic, start, 100)]
    assert offsets == list(range(3000))
    # Full segments are exported within a second; the active segment (the tail) is not.
    exported = until_sync(
        lambda: [o for o in objects_of(broker, topic) if o[1] >= 1000], "objects up to 1000", 60
    )
    assert exported[-1][1] < 2999, "the newest offsets must still be WAL-only for this test"
    rows = read(spark, broker, topic, includeHeaders="true").orderBy("offset").collect()
    assert [r.offset for r in rows] == list(range(3000))
    for i, r in enumerate(rows):
        assert r.value == f"m{i:06d}".encode() + b"x" * 90
        assert r.key == f"k{i % 5}".encode()
        assert r.topic == topic and r.partition == -1 and r.timestampType == 0
        assert [(h.key, h.value) for h in r.headers] == [("n", str(i).encode())]
    assert rows[0].timestamp is not None and rows[0].producer


def test_batch_read_of_an_offset_range_in_several_input_partitions(spark: Any, broker: BrokerProcess) -> None:
    topic = new_topic("range")
    produce(broker.url, topic, 0, 1000)
    df = read(
        spark,
        broker,
        topic,
        startingOffsets=json.dumps({topic: {"-1": 100}}),
        endingOffsets=json.dumps({topic: {"-1": 900}}),
        minPartitions="4",
    )
    assert df.rdd.getNumPartitions() == 4
    offsets = sorted(r.offset for r in df.select("offset").collect())
    assert offsets == list(range(100, 900))
    assert "headers" not in df.columns


def test_bad_options_fail_clearly(spark: Any, broker: BrokerProcess) -> None:
    with pytest.raises(Exception, match="exactly one of the options topic, topics, topicsPattern"):
        spark.read.format("ister").option("ister.service.url", broker.url).load().collect()
    with pytest.raises(Exception, match="'latest' is not allowed in a batch query"):
        read(spark, broker, "/default/x", startingOffsets="latest").collect()
    with pytest.raises(Exception, match="unknown source option 'startingoffset'"):
        read(spark, broker, "/default/x", startingOffset="earliest").collect()
    with pytest.raises(Exception, match="does not exist"):
        read(spark, broker, new_topic("missing")).collect()


def run_available_now(spark: Any, broker: BrokerProcess, topic: str, out: Path, **options: str) -> list[Any]:
    reader = (
        spark.readStream.format("ister")
        .option("ister.service.url", broker.url)
        .option("startingOffsets", "earliest")
    )
    if topic:
        reader = reader.option("topic", topic)
    for k, v in options.items():
        reader = reader.option(k, v)
    query = (
        reader.load()
        .writeStream.format("parquet")
        .option("checkpointLocation", str(out / "_checkpoint"))
        .trigger(availableNow=True)
        .start(str(out))
    )
    query.awaitTermination()
    assert query.exception() is None
    return [p for p in query.recentProgress if p["numInputRows"] > 0]


def test_streaming_available_now_reads_only_new_data_on_the_second_run(
    spark: Any, broker: BrokerProcess, tmp_path: Path
) -> None:
    topic = new_topic("stream")
    out = tmp_path / "table"
    produce(broker.url, topic, 0, 500)
    first = run_available_now(spark, broker, topic, out)
    assert sum(p["numInputRows"] for p in first) == 500
    produce(broker.url, topic, 500, 300)
    second = run_available_now(spark, broker, topic, out, maxOffsetsPerTrigger="100")
    assert [p["numInputRows"] for p in second] == [100, 100, 100]  # only the new data, capped per batch
    assert json.loads(second[0]["sources"][0]["endOffset"]) == {topic: {"-1": 600}}
    offsets = sorted(r.offset for r in spark.read.parquet(str(out)).select("offset").collect())
    assert offsets == list(range(800))


def test_sink_writes_rows_that_read_back(spark: Any, broker: BrokerProcess) -> None:
    topic = new_topic("sink")
    df = spark.createDataFrame(
        [(f"v{i}".encode(), f"k{i}", [{"key": "h", "value": f"{i}".encode()}]) for i in range(200)],
        "value binary, key string, headers array<struct<key: string, value: binary>>",
    )
    writer = df.write.format("ister").option("ister.service.url", broker.url).option("topic", topic)
    with pytest.raises(Exception, match="append"):
        writer.mode("overwrite").save()  # a topic is a log: nothing to overwrite
    writer.mode("append").save()
    rows = read(spark, broker, topic, includeHeaders="true").collect()
    assert sorted(r.value for r in rows) == sorted(f"v{i}".encode() for i in range(200))
    for r in rows:
        i = int(r.value[1:])
        assert r.key == f"k{i}".encode()
        headers = {h.key: h.value.decode() for h in r.headers}
        assert headers["h"] == str(i)
        write_id, batch, partition, seq = headers[BATCH_HEADER].split(":")
        assert write_id
        assert batch == "0" and partition.isdigit() and seq.isdigit()
    marks = [{h.key: h.value for h in r.headers}[BATCH_HEADER] for r in rows]
    assert len(set(marks)) == 200  # unique per row: readers can drop a retried task's duplicates


def test_streaming_sink_marks_rows_with_query_and_batch(
    spark: Any, broker: BrokerProcess, tmp_path: Path
) -> None:
    source, target = new_topic("pipe_in"), new_topic("pipe_out")
    produce(broker.url, source, 0, 150)
    query = (
        spark.readStream.format("ister")
        .option("ister.service.url", broker.url)
        .option("topic", source)
        .option("startingOffsets", "earliest")
        .load()
        .select("value", "key")
        .writeStream.format("ister")
        .option("ister.service.url", broker.url)
        .option("topic", target)
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert query.exception() is None
    rows = read(spark, broker, target, includeHeaders="true").collect()
    assert sorted(r.value for r in rows) == sorted(f"m{i:06d}".encode() + b"x" * 90 for i in range(150))
    marks = {h.value.decode() for r in rows for h in r.headers if h.key == BATCH_HEADER}
    assert len(marks) == 150
    assert {m.split(":")[0] for m in marks} == {query.id}
    assert {m.split(":")[1] for m in marks} == {"0"}


def test_old_latest_offset_signature_applies_max_offsets_per_trigger(broker: BrokerProcess) -> None:
    """Spark 4.0/4.1 call `latestOffset()` without start or limit: the reader caps from its last plan."""
    from ister.spark.options import SourceOptions
    from ister.spark.source import IsterStreamReader

    topic = new_topic("oldsig")
    produce(broker.url, topic, 0, 250)
    options = {"ister.service.url": broker.url, "topic": topic, "startingOffsets": "earliest"}
    reader = IsterStreamReader(
        SourceOptions.parse({**options, "maxOffsetsPerTrigger": "100"}, streaming=True)
    )
    start = reader.initialOffset()
    assert start == {topic: {"-1": 0}}
    ends = []
    for _ in range(4):
        end = reader.latestOffset()
        reader.partitions(start, end)
        ends.append(end[topic]["-1"])
        start = end
    assert ends == [100, 200, 250, 250]


def test_sink_routes_rows_to_the_partition_column(spark: Any, broker: BrokerProcess) -> None:
    topic = new_topic("sinkparts")
    with BlockingClient(broker.url) as client, client.producer(topic, partitions=3) as producer:
        producer.send(b"seed")  # creates /ns/t-part-0..2
    df = spark.createDataFrame([(f"v{i}", i % 3) for i in range(30)], "value string, partition int")
    df.write.format("ister").option("ister.service.url", broker.url).option("topic", topic).mode(
        "append"
    ).save()
    rows = read(spark, broker, topic).where("value != 'seed'").collect()
    assert sorted((r.value.decode(), r.partition) for r in rows) == sorted(
        (f"v{i}", i % 3) for i in range(30)
    )


def test_sink_routes_by_topic_column_keeps_task_order_and_takes_map_headers(
    spark: Any, broker: BrokerProcess
) -> None:
    """Rows of one task reach each topic in row order (the batch header's seq grows with the offset),
    a map headers column becomes attributes, and each row goes to the topic it names."""
    topics = [new_topic("sinkcol"), new_topic("sinkcol")]
    rows = [(f"v{i}".encode(), topics[i % 2], {"n": str(i)}) for i in range(25_000)]
    df = spark.createDataFrame(rows, "value binary, topic string, headers map<string, string>")
    df.repartition(2).write.format("ister").option("ister.service.url", broker.url).mode("append").save()
    for t, topic in enumerate(topics):
        got = read(spark, broker, topic, includeHeaders="true").collect()
        assert sorted(int(r.value[1:]) for r in got) == list(range(t, 25_000, 2))
        by_task: dict[str, list[tuple[int, int]]] = {}
        for r in got:
            headers = {h.key: h.value.decode() for h in r.headers}
            assert headers["n"] == r.value[1:].decode()
            _, _, task, seq = headers[BATCH_HEADER].split(":")
            by_task.setdefault(task, []).append((r.offset, int(seq)))
        assert len(by_task) == 2
        for pairs in by_task.values():
            seqs = [seq for _, seq in sorted(pairs)]
            assert seqs == sorted(seqs)


def test_sink_refuses_a_null_value_with_a_clear_error(spark: Any, broker: BrokerProcess) -> None:
    df = spark.createDataFrame([(b"ok",), (None,)], "value binary")
    topic = new_topic("null")
    writer = df.write.format("ister").option("ister.service.url", broker.url).option("topic", topic)
    with pytest.raises(Exception, match="null value"):
        writer.mode("append").save()


LAG = "danube_subscription_lag_messages"


def lag_on_broker(broker: BrokerProcess, topic: str, sub: str) -> float | None:
    return subscription_metric(broker.metrics_url, LAG, topic, sub)


def test_predefined_subscription_makes_the_lag_visible_on_the_broker(
    spark: Any, broker: BrokerProcess, tmp_path: Path
) -> None:
    """The named cursor follows what Spark committed: at the head after an availableNow run, behind by
    exactly what was published since, and where a consumer of that subscription would start."""
    topic = new_topic("lag")
    out = tmp_path / "table"
    produce(broker.url, topic, 0, 300)
    options = {"maxOffsetsPerTrigger": "100", "predefinedSubscription": "spark-q1"}
    run_available_now(spark, broker, topic, out, **options)
    until_sync(lambda: lag_on_broker(broker, topic, "spark-q1") == 0, "lag 0 after the run", 10)
    produce(broker.url, topic, 300, 50)  # lag 50 = head 350 - the cursor Spark left at 300
    until_sync(lambda: lag_on_broker(broker, topic, "spark-q1") == 50, "lag 50 with Spark stopped", 10)
    run_available_now(spark, broker, topic, out, predefinedSubscription="spark-q1")
    until_sync(lambda: lag_on_broker(broker, topic, "spark-q1") == 0, "lag 0 after the second run", 10)
    offsets = sorted(r.offset for r in spark.read.parquet(str(out)).select("offset").collect())
    assert offsets == list(range(350))  # the cursor never steers reading: the checkpoint does
    with pytest.raises(Exception, match="streaming queries only"):
        read(spark, broker, topic, predefinedSubscription="x").collect()
