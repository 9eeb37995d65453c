"""`ister dev`'s plan (ports, replication), its state file and the pid checks `status` and `down` rely on,
and the table and export lines `up` prints."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ister.cli.dev import exports, table
from ister.devcluster.dev import DevCluster
from ister.devcluster.spec import MAX_PORT_BASE, BrokerPlan, S3Target, plan_ports, replication_factor
from ister.devcluster.state import Plan, alive, read_plan, read_state, write_plan, write_state


def all_ports(brokers: int, base: int | None) -> list[int]:
    p = plan_ports(brokers, base)
    weed = [*p.weed.values(), *(v + 10_000 for k, v in p.weed.items() if k not in ("iceberg", "lance"))]
    return [p.etcd_client, p.etcd_peer, *weed, *(x for b in p.brokers for x in b)]


@pytest.mark.parametrize(
    ("brokers", "base"), [(1, None), (3, None), (9, None), (3, 20_000), (9, MAX_PORT_BASE)]
)
def test_no_two_services_share_a_port(brokers: int, base: int | None) -> None:
    ports = all_ports(brokers, base)
    assert len(ports) == len(set(ports)) and max(ports) <= 65535


def test_the_usual_ports_without_a_base() -> None:
    p = plan_ports(3, None)
    assert p.brokers == [(6650, 50051, 9040), (6651, 50052, 9041), (6652, 50053, 9042)]
    assert (p.etcd_client, p.etcd_peer, p.weed["s3"]) == (2379, 2380, 8333)


@pytest.mark.parametrize(
    ("brokers", "base", "message"),
    [
        (0, None, "--brokers must be in 1..9"),
        (10, None, "--brokers must be in 1..9"),
        (3, 80, "--port-base must be in 1024.."),
        (3, MAX_PORT_BASE + 1, "--port-base must be in 1024.."),
    ],
)
def test_bad_sizes_and_bases_are_refused(brokers: int, base: int | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_ports(brokers, base)


def test_replication_factor_is_at_most_three() -> None:
    assert [replication_factor(n) for n in (1, 2, 3, 5)] == [1, 2, 3, 3]
    config = BrokerPlan(5, ["127.0.0.1:2379"], s3=S3Target("http://127.0.0.1:8333")).config()
    assert config["cluster"]["replication_factor"] == 3
    assert config["storage"]["durable"]["url"] == "s3://ister-dev"
    assert BrokerPlan(1, ["e:1"], file_tier="file:///x").config()["storage"]["durable"] == {
        "url": "file:///x"
    }


def test_plan_and_state_round_trip_and_a_broken_file_is_named(tmp_path: Path) -> None:
    plan = Plan(3, True, plan_ports(3, 30_000))
    write_plan(tmp_path, plan)
    assert read_plan(tmp_path) == plan
    write_state(tmp_path, {"pid": 1, "services": []})
    assert read_state(tmp_path) == {"pid": 1, "services": []}
    (tmp_path / "plan.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"plan.json cannot be read .* use --fresh"):
        read_plan(tmp_path)
    assert read_state(tmp_path / "nowhere") is None


def test_alive_only_for_the_recorded_process() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert alive(child.pid, "time.sleep")
        assert not alive(child.pid, "etcd")  # the pid is someone else's program
    finally:
        child.kill()
        child.wait()
    assert not alive(child.pid, "time.sleep")
    assert not alive(None, "x") and not alive(-1, "x") and not alive(os.getpid() + 10_000_000, "x")


def test_the_table_and_export_lines() -> None:
    state = {
        "services": [
            {"name": "etcd", "pid": 10, "addresses": {"client": "http://127.0.0.1:2379"}},
            {"name": "s3", "pid": 11, "addresses": {"s3": "http://127.0.0.1:8333", "bucket": "ister-dev"}},
            {
                "name": "broker-0",
                "pid": 12,
                "addresses": {"client": "http://127.0.0.1:6650", "admin": "127.0.0.1:50051"},
            },
        ]
    }
    assert table(state) == [
        "SERVICE   PID  ROLE    ADDRESS",
        "etcd      10   client  http://127.0.0.1:2379",
        "s3        11   s3      http://127.0.0.1:8333",
        "s3             bucket  ister-dev",
        "broker-0  12   client  http://127.0.0.1:6650",
        "broker-0       admin   127.0.0.1:50051",
    ]
    lines = exports(state)
    assert lines[:3] == [
        "export ISTER_SERVICE_ADDR=http://127.0.0.1:6650",
        "export ISTER_ADMIN_ADDR=127.0.0.1:50051",
        "export ETCDCTL_ENDPOINTS=http://127.0.0.1:2379",
    ]
    assert "export AWS_ENDPOINT_URL=http://127.0.0.1:8333" in lines


def test_the_brokers_share_one_table_catalog_in_the_dev_directory(tmp_path: Path) -> None:
    """Each broker's own SQLite catalog would hold only the tables of the topics it led: `ister table`,
    `namespaces tables` and `drop-table` asked of one broker missed the others' (found by hand on
    `ister dev up`: the printed snippet raised NoSuchTableError for a topic led by broker-1)."""
    cluster = DevCluster(tmp_path, Plan(3, False, plan_ports(3, 30_000)), lambda _: None)
    config = yaml.safe_load(cluster.broker_plan.config_yaml())
    assert config["tables"] == {"catalog_uri": f"sqlite:///{(tmp_path / 'tables' / 'catalog.db').resolve()}"}
    assert "tables" not in BrokerPlan(1, ["e:1"]).config()  # compose: the broker's own default
