"""`ister pipeline export`: killed mid-run and started again, the table has every row exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import BrokerProcess
from tests.spark.test_spark_source import lag_on_broker, new_topic, produce, until

pytestmark = pytest.mark.timeout(400)


def export_cmd(broker: BrokerProcess, topics: list[str], out: Path) -> list[str]:
    cmd = [sys.executable, "-m", "ister.cli", "pipeline", "export", "-s", broker.url, "--to", str(out)]
    for t in topics:
        cmd += ["--topic", t]
    return [*cmd, "--max-offsets-per-trigger", "250", "--lag-subscription", "lake", "--master", "local[2]"]


def committed_batches(out: Path) -> int:
    log = out / "_spark_metadata"
    return len([p for p in log.glob("*") if p.name.isdigit()]) if log.exists() else 0


def test_export_killed_mid_run_then_restarted_writes_each_row_once(
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
        # 4,000 offsets at 250 per batch are 16 batches: kill once a few are committed, mid-run.
        until(lambda: committed_batches(out) >= 3 or first.poll() is not None, "three committed batches", 180)
        assert first.poll() is None, (tmp_path / "export1.log").read_text()[-3000:]
        first.send_signal(signal.SIGKILL)
        first.wait()
    finally:
        log.close()
    done_before = committed_batches(out)
    assert 3 <= done_before < 16
    second = subprocess.run(
        export_cmd(broker, [a, b], out), capture_output=True, text=True, env=env, timeout=300
    )
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "exported" in second.stdout
    table = spark.read.parquet(str(out))
    rows = table.select("topic", "offset", "value", "date").collect()
    by_topic: dict[str, list[int]] = {}
    for r in rows:
        by_topic.setdefault(r.topic, []).append(r.offset)
    assert sorted(by_topic[a]) == list(range(3000))  # nothing lost, nothing twice
    assert sorted(by_topic[b]) == list(range(1000))
    assert all(r.date is not None for r in rows)
    # Partitioned by topic and date, as a lakehouse table should be.
    assert {p.name.split("=")[0] for p in out.iterdir() if "=" in p.name} == {"topic"}
    logs = sorted((out / "_ister_checkpoint" / "offsets").glob("[0-9]*"), key=lambda p: int(p.name))
    assert json.loads(logs[-1].read_text().splitlines()[-1]) == {a: {"-1": 3000}, b: {"-1": 1000}}
    # The job's named cursor caught up: no lag left on the broker for either topic.
    assert [lag_on_broker(broker, t, "lake") for t in (a, b)] == [0, 0]
