"""Parquet copies of exported objects (storage.durable.parquet) read by Spark: `ister.spark.read` (history
through Spark's own Parquet reader, the rest through the `ister` format) and the format's executors
(copies read with pyarrow), both against the Python path's rows."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

import ister.spark
from ister.storage.objects import parquet
from ister.storage.objects.segment import parse_object_name
from tests.integration.harness import BrokerProcess
from tests.spark.test_spark_source import new_topic, produce
from tests.support import until_sync

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def pbroker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker exporting 32 KiB segments within a second, each with its Parquet copy; the active segment
    (the tail) is not exported."""
    root = tmp_path_factory.mktemp("spark-parquet-broker")
    config = root / "ister.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "wal": {"segment_max_bytes": 32 * 1024},
                "storage": {
                    "durable": {
                        "export_interval_seconds": 0.2,
                        "segment_max_age_seconds": 3600,
                        "local_retention_bytes": 0,
                        "local_retention_seconds": 0,
                        "parquet": True,
                    }
                },
            }
        )
    )
    b = BrokerProcess(root / "data", "--config-file", str(config))
    b.start()
    yield b
    b.stop()


def topic_dir(broker: BrokerProcess, topic: str) -> Path:
    ns, name = topic.strip("/").split("/")
    return broker.data_dir / "objects" / ns / name


def copies_of(broker: BrokerProcess, topic: str) -> list[tuple[int, int]]:
    found = [parquet.parse_parquet_name(p.name) for p in topic_dir(broker, topic).glob("*.parquet")]
    return sorted(r for r in found if r is not None)


def objects_of(broker: BrokerProcess, topic: str) -> list[tuple[int, int]]:
    found = [parse_object_name(p.name) for p in topic_dir(broker, topic).glob("*.dnb1")]
    return sorted(r for r in found if r is not None)


def filled(broker: BrokerProcess, name: str, count: int = 3000) -> str:
    """A topic of `count` records, most of them exported with their copies, the newest still WAL-only."""
    topic = new_topic(name)
    for start in range(0, count, 100):
        produce(broker.url, topic, start, 100)

    seen: list[tuple[float, object]] = []

    def settled() -> bool:
        """Every object has its copy (written right after it), past the middle, and nothing new for 1.5 s
        (the exporter catches up with the closed segments in passes)."""
        copies = copies_of(broker, topic)
        state = (copies, objects_of(broker, topic))
        if not seen or seen[-1][1] != state:
            seen.append((time.monotonic(), state))
            return False
        done = bool(copies) and copies[-1][1] >= count // 2 and state[0] == state[1]
        return done and time.monotonic() - seen[-1][0] >= 1.5

    until_sync(settled, "objects and copies past the middle", 60)
    assert objects_of(broker, topic)[-1][1] < count - 1, "the newest offsets must still be WAL-only"
    return topic


def options(broker: BrokerProcess, topic: str, **more: str) -> dict[str, str]:
    return {"ister.service.url": broker.url, "topic": topic, **more}


def python_path(spark: Any, opts: dict[str, str]) -> Any:
    return spark.read.format("ister").options(**opts, **{"ister.read.parquet": "false"}).load()


def norm(value: Any) -> Any:
    """Rows from Spark and from pyarrow in one shape (Spark gives naive UTC datetimes and Row structs)."""
    if isinstance(value, datetime):
        return (
            value.replace(tzinfo=None) if value.tzinfo is None else value.astimezone(UTC).replace(tzinfo=None)
        )
    if isinstance(value, dict):
        return tuple(norm(v) for v in value.values())
    if isinstance(value, (list, tuple)):  # Row is a tuple
        return tuple(norm(v) for v in value)
    return value


def rows(df: Any) -> list[tuple[Any, ...]]:
    return sorted((norm(tuple(r)) for r in df.collect()), key=lambda r: (r[2], r[3], r[4]))


def parquet_files(df: Any) -> list[str]:
    return [f for f in df.inputFiles() if f.endswith(".parquet")]


def test_copies_hold_exactly_the_objects_records(spark: Any, pbroker: BrokerProcess) -> None:
    topic = filled(pbroker, "copies")
    copies = copies_of(pbroker, topic)
    assert copies == objects_of(pbroker, topic)  # one copy per object, same ranges
    for first, last in copies:
        data = (topic_dir(pbroker, topic) / parquet.parquet_name(first, last)).read_bytes()
        table = parquet.read_table(data, first, last)
        start = json.dumps({topic: {"-1": first}})
        end = json.dumps({topic: {"-1": last + 1}})
        expected = python_path(
            spark, options(pbroker, topic, includeHeaders="true", startingOffsets=start, endingOffsets=end)
        )
        assert [norm(tuple(r.values())) for r in table.to_pylist()] == rows(expected)


@pytest.mark.parametrize("headers", ["true", "false"])
def test_read_of_history_and_tail_matches_the_python_path(
    spark: Any, pbroker: BrokerProcess, headers: str
) -> None:
    topic = filled(pbroker, f"mixed_{headers}")
    copies = copies_of(pbroker, topic)
    # A range that starts and ends inside copies, and one that runs into the unexported tail.
    inner = options(
        pbroker,
        topic,
        includeHeaders=headers,
        startingOffsets=json.dumps({topic: {"-1": copies[0][1] - 7}}),
        endingOffsets=json.dumps({topic: {"-1": copies[2][0] + 5}}),
    )
    whole = options(pbroker, topic, includeHeaders=headers)
    for opts in (inner, whole):
        fast = ister.spark.read(spark, opts)
        assert parquet_files(fast), "history must come from the Parquet copies"
        expected = python_path(spark, opts)
        assert fast.schema.simpleString() == expected.schema.simpleString()
        got = rows(fast)
        assert got == rows(expected)
        assert len(got) == len({r[4] for r in got})  # no offset twice
    assert [r[4] for r in rows(ister.spark.read(spark, whole))] == list(range(3000))
    # The format itself (executors reading the copies with pyarrow) gives the same rows too.
    assert rows(spark.read.format("ister").options(**inner).load()) == rows(python_path(spark, inner))


def test_missing_copies_are_read_from_their_objects(spark: Any, pbroker: BrokerProcess) -> None:
    """What a failed Parquet write leaves: objects without copies. Both paths read them from the objects."""
    topic = filled(pbroker, "missing")
    copies = copies_of(pbroker, topic)
    for first, last in copies[1::2]:
        (topic_dir(pbroker, topic) / parquet.parquet_name(first, last)).unlink()
    opts = options(pbroker, topic, includeHeaders="true")
    fast = ister.spark.read(spark, opts)
    assert len(parquet_files(fast)) == len(copies[0::2])
    expected = rows(python_path(spark, opts))
    assert [r[4] for r in expected] == list(range(3000))
    assert rows(fast) == expected
    assert rows(spark.read.format("ister").options(**opts).load()) == expected


def test_damaged_copies_fall_back_to_their_objects(spark: Any, pbroker: BrokerProcess) -> None:
    topic = filled(pbroker, "damaged")
    copies = copies_of(pbroker, topic)
    assert len(copies) >= 4
    path = [topic_dir(pbroker, topic) / parquet.parquet_name(a, b) for a, b in copies]
    path[0].write_bytes(b"not parquet at all" * 50)
    path[1].write_bytes(path[1].read_bytes()[:-100])  # truncated: no footer
    path[2].write_bytes(path[3].read_bytes())  # a well-formed copy of other offsets
    opts = options(pbroker, topic, includeHeaders="true")
    expected = rows(python_path(spark, opts))
    fast = ister.spark.read(spark, opts)
    assert set(parquet_files(fast)) == {f"file://{p}" for p in path[3:]}
    assert rows(fast) == expected
    assert rows(spark.read.format("ister").options(**opts).load()) == expected


def test_options_the_parquet_path_cannot_serve_use_the_format(spark: Any, pbroker: BrokerProcess) -> None:
    topic = filled(pbroker, "plain")
    off = ister.spark.read(spark, options(pbroker, topic, **{"ister.read.parquet": "false"}))
    assert not parquet_files(off)
    # A store the JVM cannot reach (memory://): the executors read everything through the broker.
    unreachable = ister.spark.read(spark, options(pbroker, topic, **{"ister.storage.url": "memory://"}))
    assert not parquet_files(unreachable)
    assert [r.offset for r in unreachable.select("offset").orderBy("offset").collect()] == list(range(3000))


def test_streaming_reads_the_copies_with_the_same_rows(
    spark: Any, pbroker: BrokerProcess, tmp_path: Path
) -> None:
    topic = filled(pbroker, "stream")
    out = tmp_path / "out"
    query = (
        spark.readStream.format("ister")
        .options(**options(pbroker, topic, startingOffsets="earliest", maxOffsetsPerTrigger="700"))
        .load()
        .writeStream.format("parquet")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start(str(out))
    )
    query.awaitTermination(240)
    got = rows(spark.read.parquet(str(out)))
    assert got == rows(python_path(spark, options(pbroker, topic)))
