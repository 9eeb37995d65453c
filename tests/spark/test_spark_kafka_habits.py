"""What a data engineer used to Spark's Kafka connector does with the `ister` format: copy rows between
topics, read empty ranges, type offset JSON by hand, point `topicsPattern` at a namespace with mixed
topics, write DataFrames of the wrong shape and mistype URLs. Real local[2] Spark, a real broker."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from ister.client.blocking import BlockingClient
from ister.core.stream_offsets import TopicPartition
from ister.errors import InvalidArgument
from ister.spark import workers_python_warning
from ister.spark.offsets import check_spec
from ister.spark.options import SourceOptions
from ister.wire.gen import DanubeAdmin_pb2 as admin_pb
from ister.wire.gen import DanubeAdmin_pb2_grpc as admin_grpc
from tests.integration.harness import BrokerProcess
from tests.spark.test_spark_source import new_topic, produce, read, run_available_now
from tests.support import free_port

pytestmark = pytest.mark.timeout(300)


def topics_on(broker: BrokerProcess, namespace: str = "default") -> set[str]:
    """Every topic the broker lists (partitions as their own `/ns/t-part-N` names)."""
    with grpc.insecure_channel(broker.admin_addr) as channel:
        listed = admin_grpc.NamespaceAdminStub(channel).GetNamespaceTopics(
            admin_pb.NamespaceRequest(name=namespace), timeout=30
        )
    return {"/" + t.lstrip("/") for t in listed.topics}


def partitioned(broker: BrokerProcess, name: str, count: int) -> str:
    topic = new_topic(name)
    with BlockingClient(broker.url) as client, client.producer(topic, partitions=count) as producer:
        producer.send(b"seed")  # creates /ns/t-part-0..count-1
    return topic


def values(spark: Any, broker: BrokerProcess, topic: str) -> list[str]:
    return sorted(r.value.decode() for r in read(spark, broker, topic).select("value").collect())


# -- 1. the sink never creates a partition ---------------------------------------------------------------


def test_copying_rows_read_from_a_topic_into_another_topic(spark: Any, broker: BrokerProcess) -> None:
    """Kafka's copy pattern: every column of the source goes to the sink; `partition` = -1 of a topic
    without partitions means "no partition", not a topic `B-part--1`."""
    a, b = new_topic("copy_a"), new_topic("copy_b")
    produce(broker.url, a, 0, 40)
    rows = read(spark, broker, a)
    rows.write.format("ister").option("ister.service.url", broker.url).option("topic", b).mode(
        "append"
    ).save()
    copied = read(spark, broker, b).collect()
    assert sorted(r.value for r in copied) == sorted(r.value for r in rows.collect())
    assert {r.partition for r in copied} == {-1}
    assert not [t for t in topics_on(broker) if t.startswith(f"{b}-part")]
    # Partitioned to partitioned keeps each row's partition, as Kafka's sink does.
    p, q = partitioned(broker, "copy_p", 3), partitioned(broker, "copy_q", 3)
    seed = spark.createDataFrame([(f"v{i}", i % 3) for i in range(30)], "value string, partition int")
    seed.write.format("ister").option("ister.service.url", broker.url).option("topic", p).mode(
        "append"
    ).save()
    read(spark, broker, p).where("value != 'seed'").write.format("ister").option(
        "ister.service.url", broker.url
    ).option("topic", q).mode("append").save()
    got = read(spark, broker, q).where("value != 'seed'").collect()
    assert sorted((r.value.decode(), r.partition) for r in got) == sorted((f"v{i}", i % 3) for i in range(30))


def test_the_sink_refuses_a_partition_the_topic_does_not_have(spark: Any, broker: BrokerProcess) -> None:
    topic = partitioned(broker, "noseventh", 3)
    before = topics_on(broker)
    df = spark.createDataFrame(
        [(f"v{i}", i % 3) for i in range(20)] + [("bad", 7)], "value string, partition int"
    ).coalesce(1)
    writer = df.write.format("ister").option("ister.service.url", broker.url).option("topic", topic)
    with pytest.raises(Exception, match=r"has no partition 7 \(it has 3: 0\.\.2\)"):
        writer.mode("append").save()
    assert topics_on(broker) == before  # no -part-7
    assert values(spark, broker, topic) == ["seed"]  # nothing of the task was sent
    # A topic without partitions, or one that does not exist yet: a partition index is refused too.
    flat = new_topic("flat")
    produce(broker.url, flat, 0, 1)
    for target, why in ((flat, "has no partitions"), (new_topic("absent"), "does not exist")):
        df = spark.createDataFrame([("x", 0)], "value string, partition int")
        writer = df.write.format("ister").option("ister.service.url", broker.url).option("topic", target)
        with pytest.raises(Exception, match=why):
            writer.mode("append").save()
    assert topics_on(broker) == before | {flat}
    # null and -1 both mean "no partition": the producer routes them over the topic's partitions.
    df = spark.createDataFrame(
        [(f"r{i}", None if i % 2 else -1) for i in range(12)], "value string, partition int"
    )
    df.write.format("ister").option("ister.service.url", broker.url).option("topic", topic).mode(
        "append"
    ).save()
    assert values(spark, broker, topic) == sorted(["seed", *(f"r{i}" for i in range(12))])
    assert topics_on(broker) == before | {flat}


# -- 2. empty reads -----------------------------------------------------------------------------------------


def test_empty_reads_are_empty_dataframes(spark: Any, broker: BrokerProcess) -> None:
    empty = new_topic("empty")
    with BlockingClient(broker.url) as client, client.producer(empty, reliable=True):
        pass  # a reliable topic with no message
    assert read(spark, broker, empty).count() == 0
    full = new_topic("full")
    produce(broker.url, full, 0, 30)
    same = json.dumps({full: {"-1": 10}})
    assert read(spark, broker, full, startingOffsets=same, endingOffsets=same).count() == 0
    nothing = {"topicsPattern": r"/default/matches_nothing_.*", "ister.admin.url": broker.admin_addr}
    reader = spark.read.format("ister").option("ister.service.url", broker.url)
    assert reader.options(**nothing).load().count() == 0
    after = json.dumps({full: {"-1": 20}})
    before = json.dumps({full: {"-1": 5}})
    with pytest.raises(Exception, match=r"startingOffsets 20 is after endingOffsets 5"):
        read(spark, broker, full, startingOffsets=after, endingOffsets=before).collect()


# -- 4. offset JSON keys that match nothing ----------------------------------------------------------------


def test_offset_json_keys_must_name_partitions_of_the_query(spark: Any, broker: BrokerProcess) -> None:
    flat = new_topic("keys")
    produce(broker.url, flat, 0, 50)
    parts = partitioned(broker, "keys_p", 2)
    # "0" is what a Kafka user types for a topic without partitions (Kafka's single partition 0).
    df = read(spark, broker, flat, startingOffsets=json.dumps({flat: {"0": 40}}))
    assert sorted(r.offset for r in df.select("offset").collect()) == list(range(40, 50))
    bad = [
        ({flat: {"1": 3}}, f"{flat} has no partition 1"),
        ({parts: {"2": 0}}, f"{parts} has no partition 2"),
        ({"/default/not_in_query": {"0": 0}}, "/default/not_in_query is not read by this query"),
    ]
    for spec, why in bad:
        for option in ("startingOffsets", "endingOffsets"):
            with pytest.raises(Exception, match=why) as info:
                read(spark, broker, f"{flat},{parts}", **{option: json.dumps(spec)}).collect()
            # As Kafka's source: the message lists the partitions the query has.
            assert f"{flat}: -1 (or 0)" in str(info.value)
            assert f"{parts}: 0, 1" in str(info.value)


def test_streaming_offset_json_is_checked_too(spark: Any, broker: BrokerProcess, tmp_path: Path) -> None:
    topic = new_topic("skeys")
    produce(broker.url, topic, 0, 20)
    with pytest.raises(Exception, match=f"{topic} has no partition 3"):
        run_available_now(spark, broker, topic, tmp_path / "a", startingOffsets=json.dumps({topic: {"3": 0}}))
    progress = run_available_now(
        spark, broker, topic, tmp_path / "b", startingOffsets=json.dumps({topic: {"0": 15}})
    )
    assert sum(p["numInputRows"] for p in progress) == 5


# -- 5. topicsPattern skips topics it cannot read ------------------------------------------------------------


def test_topics_pattern_skips_topics_that_are_not_reliable(
    spark: Any, broker: BrokerProcess, tmp_path: Path
) -> None:
    reliable, plain = new_topic("mixed_rel"), new_topic("mixed_plain")
    produce(broker.url, reliable, 0, 25)
    with BlockingClient(broker.url) as client, client.producer(plain, reliable=False) as producer:
        producer.send(b"not stored")
    pattern = {"topicsPattern": r"/default/mixed_.*", "ister.admin.url": broker.admin_addr}
    df = spark.read.format("ister").option("ister.service.url", broker.url).options(**pattern).load()
    assert sorted(r.offset for r in df.where(df.topic == reliable).select("offset").collect()) == list(
        range(25)
    )
    assert df.where(df.topic == plain).count() == 0
    progress = run_available_now(spark, broker, "", tmp_path / "out", **pattern)
    assert sum(p["numInputRows"] for p in progress) == 25


# -- 6. the sink checks the DataFrame's schema on the driver -------------------------------------------------


def test_the_sink_checks_column_types_before_any_task_writes(spark: Any, broker: BrokerProcess) -> None:
    topic = new_topic("types")
    cases = [
        ("value string, headers string", ("v", "h"), "headers must be array<struct"),
        ("value string, key int", ("v", 1), "key must be string or binary, got int"),
        ("value string, headers map<string,int>", ("v", {"a": 1}), r"got map<string,int>"),
        ("value int", (1,), "'value' column of type binary or string, got int"),
        ("value string, partition string", ("v", "0"), "partition must be an integer"),
    ]
    for ddl, row, why in cases:
        # Two tasks: the check must come before either starts (an int key used to be sent as text).
        df = spark.createDataFrame([row] * 3, ddl).union(spark.createDataFrame([row], ddl)).repartition(2)
        writer = df.write.format("ister").option("ister.service.url", broker.url)
        with pytest.raises(Exception, match=why):
            writer.option("topic", topic).mode("append").save()
    df = spark.createDataFrame([("v", 1)], "value string, topic int")
    with pytest.raises(Exception, match="topic must be a string, got int"):
        df.write.format("ister").option("ister.service.url", broker.url).mode("append").save()
    assert topic not in topics_on(broker)  # refused on the driver: no task ran


# -- 7. smaller things -------------------------------------------------------------------------------------


def test_fail_on_data_loss_false_with_a_start_past_the_head_reads_nothing(
    spark: Any, broker: BrokerProcess, tmp_path: Path
) -> None:
    topic = new_topic("pasthead")
    produce(broker.url, topic, 0, 10)
    past = json.dumps({topic: {"-1": 100}})
    with pytest.raises(Exception, match="past the head"):
        read(spark, broker, topic, startingOffsets=past).collect()
    assert read(spark, broker, topic, startingOffsets=past, failOnDataLoss="false").count() == 0
    out = tmp_path / "out"
    options = {"startingOffsets": past, "failOnDataLoss": "false"}
    assert run_available_now(spark, broker, topic, out, **options) == []
    produce(broker.url, topic, 10, 4)  # the query starts at the head: it reads what comes next
    assert sum(p["numInputRows"] for p in run_available_now(spark, broker, topic, out, **options)) == 4


def test_bad_urls_and_timeouts_fail_fast_and_clearly(
    spark: Any, broker: BrokerProcess, tmp_path: Path
) -> None:
    topic = new_topic("urls")
    produce(broker.url, topic, 0, 1)
    reader = spark.read.format("ister").option("ister.service.url", broker.url)
    closed = f"127.0.0.1:{free_port()}"
    pattern = {"topicsPattern": "/default/.*"}
    with pytest.raises(Exception, match=f"ister.admin.url {closed}: cannot list topics") as info:
        reader.options(**pattern, **{"ister.admin.url": closed}).load().collect()
    assert "debug_error_string" not in str(info.value) and "_InactiveRpcError" not in str(info.value)
    with pytest.raises(Exception, match=r"ister\.admin\.url: expected host:port"):
        reader.options(**pattern, **{"ister.admin.url": "no such thing"}).load().collect()
    # Bad URLs are refused by the option check, before any connection (the messages are the check's); a
    # broker that is not there fails within the connect timeout given (the message names it). Both are
    # shown by what the errors say, not by a wall-clock bound that a loaded machine breaks.
    with pytest.raises(Exception, match=r"ister\.service\.url: 'not a url' is not a broker URL"):
        read(spark, broker, topic, **{"ister.service.url": "not a url"}).collect()
    with pytest.raises(Exception, match=r"ister\.service\.url: 'ftp://x:1' is not a broker URL"):
        read(spark, broker, topic, **{"ister.service.url": "ftp://x:1"}).collect()
    # The connect timeout is an option: a broker that is not there fails within it.
    with pytest.raises(Exception, match=r"cannot connect to http://127\.0\.0\.1:\d+ within 1\.5 s"):
        read(spark, broker, topic, **{"ister.service.url": closed, "ister.connect.timeout": "1.5"}).collect()
    with pytest.raises(Exception, match=r"ister\.connect\.timeout: expected a number of seconds"):
        read(spark, broker, topic, **{"ister.connect.timeout": "soon"}).collect()
    # endingOffsets on a stream: the connector's message, not PySpark's UnboundLocalError.
    with pytest.raises(Exception, match="endingOffsets applies to batch queries only") as info:
        run_available_now(spark, broker, topic, tmp_path / "s", endingOffsets="latest")
    assert "UnboundLocalError" not in str(info.value)


def test_register_warns_when_spark_workers_run_another_python(spark: Any) -> None:
    """Spark starts its Python workers with PYSPARK_PYTHON: without ister there, every read fails."""
    assert spark.sparkContext.pythonExec == sys.executable  # as local_session (the export job) sets it
    assert workers_python_warning(spark.sparkContext.pythonExec) is None
    warning = workers_python_warning("/usr/bin/some-other-python3")
    assert warning is not None and f"PYSPARK_PYTHON={sys.executable}" in warning


def test_url_and_offset_key_checks_without_spark() -> None:
    """The option parsing behind the tests above, on cases too many to run through Spark."""
    base = {"topic": "/default/t"}

    def url(raw: str) -> str:
        return SourceOptions.parse({**base, "ister.service.url": raw}, streaming=False).service_url

    assert url("127.0.0.1:6650") == "http://127.0.0.1:6650"
    assert url("https://broker.example:443/, [::1]:6650") == "https://broker.example:443,http://[::1]:6650"
    for bad in ("not a url", "ftp://x:1", "host", "host:0", "host:99999", "http://h:1/path", "h:1?x"):
        with pytest.raises(InvalidArgument, match="is not a broker URL"):
            url(bad)
    admin = {**base, "ister.service.url": "h:1", "topic": "", "topicsPattern": ".*"}
    assert SourceOptions.parse({**admin, "ister.admin.url": "http://h:50051"}, streaming=True).admin_url == (
        "h:50051"
    )
    tps = [TopicPartition("/default/a", -1), TopicPartition("/default/b", 0), TopicPartition("/default/b", 1)]
    assert check_spec({"/default/a": {"0": 5}}, "startingOffsets", tps) == {"/default/a": {"-1": 5}}
    with pytest.raises(InvalidArgument, match="given twice"):
        check_spec({"/default/a": {"0": 5, "-1": 6}}, "startingOffsets", tps)
    with pytest.raises(InvalidArgument, match=r"/default/b has no partition -1; the query has"):
        check_spec({"/default/b": {"-1": 5}}, "startingOffsets", tps)
    assert check_spec("earliest", "startingOffsets", tps) == "earliest"


def test_starting_timestamp_and_offsets_by_timestamp(spark: Any, broker: BrokerProcess) -> None:
    """Kafka's `startingTimestamp` / `startingOffsetsByTimestamp`: the first message published at or after
    the time (its offset found by the broker from the units' publish-time ranges), the head when none is."""
    topic = new_topic("by_time")
    produce(broker.url, topic, 0, 40)
    cut = int(time.time() * 1000) + 1
    while int(time.time() * 1000) <= cut:  # the next messages are published strictly after `cut`
        time.sleep(0.001)
    produce(broker.url, topic, 40, 25)
    rows = read(spark, broker, topic, startingTimestamp=str(cut)).select("offset").collect()
    assert sorted(r.offset for r in rows) == list(range(40, 65))
    by_partition = json.dumps({topic: {"0": cut}})  # "0" names the topic without partitions, as in Kafka
    rows = read(spark, broker, topic, startingOffsetsByTimestamp=by_partition).select("offset").collect()
    assert sorted(r.offset for r in rows) == list(range(40, 65))
    later = str(int(time.time() * 1000) + 60_000)
    assert read(spark, broker, topic, startingTimestamp=later).count() == 0  # after every message: the head
    with pytest.raises(Exception, match="startingTimestamp"):
        read(spark, broker, topic, startingTimestamp="yesterday").count()
