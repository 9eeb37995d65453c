"""A broker waits for its dependencies at start (ister/startwait.py): started 10 s before etcd it becomes
ready and serves; `/readyz` says what it waits for until then; the start timeout ends the wait with a
clear error and exit status 3; the object store's first reach is waited for the same way; a stop while
waiting exits cleanly."""

from __future__ import annotations

import json
import re
import signal
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from ister.devcluster.ports import free_port, wait_port
from ister.devcluster.seaweed import pick_ports
from tests.etcd_server import EtcdServer
from tests.integration.harness import BrokerProcess, client, consumer, producer, take
from tests.seaweed_server import ACCESS_KEY, REGION, SECRET_KEY, SeaweedServer
from tests.support import until

pytestmark = pytest.mark.integration

WAIT = 60.0
RF1 = {"ISTER_CLUSTER__REPLICATION_FACTOR": "1"}


def readyz(broker: BrokerProcess) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(broker.readyz_url, timeout=5) as resp:
            return int(resp.status), json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), json.loads(exc.read())


def waited(broker: BrokerProcess, what: str) -> float | None:
    """How long `/readyz` says the broker has waited for `what` (None: it does not say it waits)."""
    status, body = readyz(broker)
    reason = body.get("waiting_for") or ""
    found = re.search(r"waiting (\d+) s\)$", reason)
    if status != 503 or not reason.startswith(f"waiting for {what} at ") or found is None:
        return None
    assert reason in body["reasons"]
    return float(found.group(1))


def cluster_broker(tmp_path: Path, etcd_endpoint: str, *extra: str) -> BrokerProcess:
    return BrokerProcess(
        tmp_path / "b0",
        "--mode",
        "cluster",
        "--etcd-endpoints",
        etcd_endpoint,
        "--cluster-name",
        "wait",
        *extra,
        env=RF1,
    )


@pytest.mark.timeout(240)
async def test_a_broker_started_10_s_before_etcd_waits_then_serves(tmp_path: Path) -> None:
    etcd = EtcdServer(tmp_path / "etcd", ports=(free_port(), free_port()))  # ports known, nothing listens
    broker = cluster_broker(tmp_path, etcd.endpoint)
    broker.launch()
    try:
        assert broker.proc is not None
        wait_port(broker.prom_port, broker.proc, 30, "broker metrics")
        # Waiting: live, not ready, and /readyz says for what, where and for how long.
        await until(lambda: (waited(broker, "etcd") or 0) >= 10, "the broker waited 10 s for etcd", WAIT)
        status, body = readyz(broker)
        assert status == 503 and body["waiting_for"].startswith(
            f"waiting for etcd at http://{etcd.endpoint} ("
        )
        assert (
            "connection refused" in body["waiting_for"].lower()
            or "unavailable" in body["waiting_for"].lower()
        )
        assert broker.running
        etcd.start()
        broker.wait_listening(WAIT)
        await until(lambda: readyz(broker)[0] == 200, "the broker ready once etcd answers", WAIT)
        assert "waiting_for" not in readyz(broker)[1]
        log = broker.log()
        assert re.search(
            rf"waiting for etcd at http://{etcd.endpoint}: attempt \d+ failed .*next try in", log
        )
        assert "reached etcd at" in log
        c = await client(broker.url)
        prod = await producer(c, "/default/late-etcd", "p1", reliable=True)
        cons, queue = await consumer(c, "/default/late-etcd", "c1", "s1")
        for i in range(5):
            await prod.send(f"m{i}".encode(), {})
        got = await take(queue, 5, ack=cons)
        assert [bytes(m.payload) for m in got] == [f"m{i}".encode() for i in range(5)]
        assert broker.terminate() == 0
    finally:
        broker.stop()
        etcd.stop()


def test_the_start_timeout_ends_the_wait_with_status_3(tmp_path: Path) -> None:
    nowhere = f"127.0.0.1:{free_port()}"
    broker = cluster_broker(tmp_path, nowhere, "--start-timeout", "3")
    broker.launch()
    assert broker.proc is not None
    code = broker.proc.wait(60)
    broker.proc = None
    log = broker.log()
    assert code == 3, log
    assert f"error: etcd at http://{nowhere} was not reached within the start timeout of 3 s (" in log, log
    assert log.count(f"waiting for etcd at http://{nowhere}: attempt") >= 2


def test_a_stop_while_waiting_exits_cleanly(tmp_path: Path) -> None:
    broker = cluster_broker(tmp_path, f"127.0.0.1:{free_port()}")
    broker.launch()
    assert broker.proc is not None
    wait_port(broker.prom_port, broker.proc, 30, "broker metrics")
    broker.proc.send_signal(signal.SIGTERM)
    assert broker.proc.wait(30) == 0, broker.log()
    broker.proc = None
    assert "stopped while waiting for dependencies" in broker.log()


async def test_the_object_store_is_waited_for_too(tmp_path: Path) -> None:
    names = ["master", "volume", "filer", "s3", "admin", "iceberg", "lance"]
    weed = SeaweedServer(
        tmp_path / "weed", bucket="late", ports=dict(zip(names, pick_ports(len(names)), strict=True))
    )
    config = tmp_path / "ister.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "storage": {
                    "durable": {
                        "url": "s3://late",
                        "options": {
                            "endpoint": weed.endpoint,
                            "region": REGION,
                            "access_key_id": ACCESS_KEY,
                            "secret_access_key": SECRET_KEY,
                            "allow_http": "true",
                            "max_retries": "0",
                            "timeout": "2s",
                            "connect_timeout": "1s",
                        },
                    }
                }
            }
        )
    )
    broker = BrokerProcess(tmp_path / "b0", "--config-file", str(config))
    broker.launch()
    try:
        assert broker.proc is not None
        wait_port(broker.prom_port, broker.proc, 30, "broker metrics")
        await until(
            lambda: waited(broker, "the object store") is not None, "waiting for the object store", WAIT
        )
        assert "s3://late" in readyz(broker)[1]["waiting_for"]
        weed.start()
        broker.wait_listening(WAIT)
        await until(lambda: readyz(broker)[0] == 200, "ready once the object store answers", WAIT)
        c = await client(broker.url)
        prod = await producer(c, "/default/late-s3", "p1", reliable=True)
        cons, queue = await consumer(c, "/default/late-s3", "c1", "s1")
        await prod.send(b"after", {})
        assert [bytes(m.payload) for m in await take(queue, 1, ack=cons)] == [b"after"]
    finally:
        broker.stop()
        weed.stop()
