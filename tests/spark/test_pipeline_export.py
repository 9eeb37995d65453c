"""`ister pipeline export`: killed mid-batch and started again, the table has every row exactly once, as
Spark, pyarrow.dataset and DuckDB read it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.dataset as ds
import pytest

from ister.errors import InvalidArgument
from ister.spark.pipeline import PARTITION_BY, ExportJob
from ister.spark.staged import STAGING_DIR, StagedOutput
from tests.integration.harness import BrokerProcess
from tests.spark.test_spark_source import lag_on_broker, new_topic, produce
from tests.support import until_sync

pytestmark = pytest.mark.timeout(400)


def export_cmd(broker: BrokerProcess, topics: list[str], out: Path, per_trigger: int = 250) -> list[str]:
    cmd = [sys.executable, "-m", "ister.cli", "pipeline", "export", "-s", broker.url, "--to", str(out)]
    for t in topics:
        cmd += ["--topic", t]
    return [
        *cmd,
        *("--max-offsets-per-trigger", str(per_trigger)),
        *("--lag-subscription", "lake", "--master", "local[2]"),
    ]


def committed_batches(out: Path) -> int:
    """Batches in Spark's commit log of the job (its checkpoint)."""
    log = out / "_ister_checkpoint" / "commits"
    return len([p for p in log.glob("*") if p.name.isdigit()]) if log.exists() else 0


def batch_being_written(out: Path) -> bool:
    """A staged batch that Spark is writing right now (its output committer's `_temporary`)."""
    return any((out / STAGING_DIR).glob("*/*/_temporary"))


def visible_files(out: Path) -> list[Path]:
    """The data files an engine that lists the table sees (names starting with `_` or `.` are hidden)."""
    return [
        p
        for p in out.rglob("*.parquet")
        if not any(part.startswith(("_", ".")) for part in p.relative_to(out).parts)
    ]


def engines_agree(spark: Any, out: Path) -> list[tuple[str, int]]:
    """The table's (topic, offset) pairs as Spark reads them; pyarrow.dataset and DuckDB read the same
    count and the same rows, no row twice, no empty file."""
    assert all(p.stat().st_size > 0 for p in visible_files(out))
    got = sorted(
        (r.topic, r.offset) for r in spark.read.parquet(str(out)).select("topic", "offset").collect()
    )
    assert len(set(got)) == len(got), "a row is in the table twice"
    dataset = ds.dataset(str(out), format="parquet", partitioning="hive")
    assert dataset.count_rows() == len(got)
    table = dataset.to_table(columns=["topic", "offset"])
    assert sorted(zip(table["topic"].to_pylist(), table["offset"].to_pylist(), strict=True)) == got
    glob = f"{out}/*/*/*.parquet"  # topic=…/date=…/file, as the table is partitioned
    query = 'SELECT count(*), count(DISTINCT (topic, "offset")) FROM read_parquet(?, hive_partitioning=true)'
    # Its own connection: fetchone leaves the result open, which the module's shared one would keep.
    duck = duckdb.connect().execute(query, [glob]).fetchone()
    assert duck == (len(got), len(got))
    return got


def test_export_killed_mid_batch_then_restarted_writes_each_row_once(
    spark: Any, broker: BrokerProcess, tmp_path: Path
) -> None:
    a, b = new_topic("export_a"), new_topic("export_b")
    produce(broker.url, a, 0, 3000)
    produce(broker.url, b, 0, 1000)
    out = tmp_path / "table"
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    log = open(tmp_path / "export1.log", "wb")  # noqa: SIM115 - closed below
    first = subprocess.Popen(export_cmd(broker, [a, b], out), stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        # 4,000 offsets at 250 per batch are 16 batches: kill the driver while one is being written.
        until_sync(
            lambda: (committed_batches(out) >= 2 and batch_being_written(out)) or first.poll() is not None,
            "a batch being written after two committed ones",
            180,
        )
        assert first.poll() is None, (tmp_path / "export1.log").read_text()[-3000:]
        first.send_signal(signal.SIGKILL)
        first.wait()
    finally:
        log.close()
    assert 2 <= committed_batches(out) < 16
    assert list((out / STAGING_DIR).glob("*/*")), "the killed batch is left in the staging area"
    before = engines_agree(spark, out)
    assert 500 <= len(before) < 4000
    # The restart replays the killed batch exactly as its offset log planned it, then takes the rest in
    # one batch (what is tested here is the repair and each row once, not 250-offset batches again).
    second = subprocess.run(
        export_cmd(broker, [a, b], out, per_trigger=4000),
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "exported" in second.stdout
    after = engines_agree(spark, out)
    assert after == sorted([(a, i) for i in range(3000)] + [(b, i) for i in range(1000)])
    assert not list((out / STAGING_DIR).rglob("*.parquet"))  # the killed batch's files were cleaned
    rows = spark.read.parquet(str(out)).select("topic", "date").collect()
    assert all(r.date is not None for r in rows)
    # Partitioned by topic and date, as a lakehouse table should be.
    assert {p.name.split("=")[0] for p in out.iterdir() if "=" in p.name} == {"topic"}
    logs = sorted((out / "_ister_checkpoint" / "offsets").glob("[0-9]*"), key=lambda p: int(p.name))
    assert json.loads(logs[-1].read_text().splitlines()[-1]) == {a: {"-1": 3000}, b: {"-1": 1000}}
    # The job's named cursor caught up: no lag left on the broker for either topic.
    assert [lag_on_broker(broker, t, "lake") for t in (a, b)] == [0, 0]


def test_staged_batches_are_repaired_and_never_written_twice(spark: Any, tmp_path: Path) -> None:
    """The crash windows the kill above may miss: files written and closed but the write not committed
    (no `_SUCCESS`), and a committed write killed before (or while) its files were moved."""
    out, checkpoint = tmp_path / "table", tmp_path / "cp"
    checkpoint.mkdir()
    (checkpoint / "metadata").write_text(json.dumps({"id": "q-1"}) + "\n")
    staged = StagedOutput(spark, str(out), str(checkpoint), "parquet", PARTITION_BY)

    def batch(n: int) -> Any:
        rows = [("/default/t", n * 10 + i, "2026-01-01") for i in range(10)]
        return spark.createDataFrame(rows, "topic string, offset long, date string")

    for n in (4, 5):  # as the export would stage them, then "crash" before moving anything
        batch(n).write.partitionBy(*PARTITION_BY).parquet(str(out / STAGING_DIR / "q-1" / str(n)))
    (out / STAGING_DIR / "q-1" / "5" / "_SUCCESS").unlink()  # 5 never committed: Spark writes it again
    assert ds.dataset(str(out), format="parquet", partitioning="hive").count_rows() == 0
    staged.recover()
    assert engines_agree(spark, out) == [("/default/t", o) for o in range(40, 50)]
    assert staged.published(4) and not staged.published(5)
    assert not (out / STAGING_DIR / "q-1" / "5").exists()
    staged.write(batch(4), 4)  # Spark replays batch 4 (its commit log did not have it): nothing twice
    staged.write(batch(5), 5)
    assert engines_agree(spark, out) == [("/default/t", o) for o in range(40, 60)]
    # A table written by the old export (Spark's file sink) is refused, not mixed with staged batches.
    old = tmp_path / "old"
    (old / "_spark_metadata").mkdir(parents=True)
    job = ExportJob(service_url="http://127.0.0.1:1", topics=["/default/t"], path=str(old))
    with pytest.raises(InvalidArgument, match="older export"):
        job.start(spark)
