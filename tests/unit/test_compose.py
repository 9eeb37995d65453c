"""deploy/compose.yaml: the committed file is `ister dev compose`'s output, every service has what it needs
(image, command, healthcheck, ports, volumes, configs), the brokers run what `ister dev up` runs, and the
checks here fail when a service, a port or a healthcheck is missing.

No container engine runs here, so the file is checked by these explicit rules (the compose-spec schema is
not in any locked package)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from ister.devcluster.compose import CONFIG_PATH, ISTER_IMAGE, compose, compose_yaml
from ister.devcluster.dev import DevCluster
from ister.devcluster.spec import BrokerPlan, plan_ports
from ister.devcluster.state import Plan

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
ETCDS = ["etcd-1", "etcd-2", "etcd-3"]
BROKERS = ["broker-0", "broker-1", "broker-2"]
SERVICES = [*ETCDS, "seaweedfs", *BROKERS, "prometheus", "grafana"]


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def weed_flag(command: list[str], name: str) -> str:
    return next(a.split("=", 1)[1] for a in command if a.startswith(f"-{name}="))


def published(service: dict[str, Any]) -> set[int]:
    return {int(p.split(":")[0]) for p in service.get("ports", [])}


def problems(doc: dict[str, Any]) -> list[str]:  # noqa: C901  (one rule after another)
    """Everything missing or inconsistent in a compose document (empty: none)."""
    out: list[str] = []
    services = doc.get("services", {})
    for name in SERVICES:
        if name not in services:
            out.append(f"service {name} missing")
    for name, s in services.items():
        if not s.get("image"):
            out.append(f"{name}: no image")
        test = s.get("healthcheck", {}).get("test", [])
        if not test or test[0] != "CMD" or len(test) < 2:
            out.append(f"{name}: no healthcheck")
        for volume in s.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("./"):
                if not (DEPLOY / source).exists():
                    out.append(f"{name}: mounts {source}, which does not exist")
            elif source not in doc.get("volumes", {}):
                out.append(f"{name}: volume {source} not declared")
        for config in s.get("configs", []):
            if config["source"] not in doc.get("configs", {}):
                out.append(f"{name}: config {config['source']} not declared")
        for needed in s.get("depends_on", {}):
            if needed not in services:
                out.append(f"{name}: depends on {needed}, which is no service")
    members = []
    for name in ETCDS:
        if name in services:
            command = services[name]["command"]
            members.append(flag(command, "--initial-cluster"))
            if flag(command, "--advertise-client-urls") != f"http://{name}:2379":
                out.append(f"{name}: advertises another client URL")
    if len(set(members)) != 1 or (members and members[0].count("=http://") != len(ETCDS)):
        out.append(f"the etcd members disagree on the cluster: {members}")
    config = yaml.safe_load(doc.get("configs", {}).get("ister-config", {}).get("content", "{}")) or {}
    if config.get("cluster", {}).get("replication_factor") != 3:
        out.append("the brokers' config does not say replication factor 3")
    s3_endpoint = config.get("storage", {}).get("durable", {}).get("options", {}).get("endpoint", "")
    weed = services.get("seaweedfs", {}).get("command", [])
    if weed:
        s3_port = int(weed_flag(weed, "s3.port"))
        if s3_endpoint != f"http://seaweedfs:{s3_port}":
            out.append(f"the brokers' S3 endpoint {s3_endpoint} is not SeaweedFS's S3 port {s3_port}")
        if s3_port not in published(services["seaweedfs"]):
            out.append("seaweedfs: S3 port not published")
    scrape = yaml.safe_load(doc.get("configs", {}).get("prometheus-config", {}).get("content", "{}")) or {}
    targets = [
        t for job in scrape.get("scrape_configs", []) for c in job["static_configs"] for t in c["targets"]
    ]
    for name in BROKERS:
        if name not in services:
            continue
        s = services[name]
        command = s["command"]
        if s["image"] != ISTER_IMAGE:
            out.append(f"{name}: image {s['image']}, not {ISTER_IMAGE}")
        if flag(command, "--mode") != "cluster":
            out.append(f"{name}: not in cluster mode")
        if flag(command, "--etcd-endpoints") != ",".join(f"{e}:2379" for e in ETCDS):
            out.append(f"{name}: not every etcd member is an endpoint")
        ports = [
            int(flag(command, f).rsplit(":", 1)[1])
            for f in ("--broker-addr", "--admin-addr", "--prom-exporter")
        ]
        missing = set(ports) - published(s)
        if missing:
            out.append(f"{name}: ports {sorted(missing)} not published")
        if f"{name}:{ports[2]}" not in targets:
            out.append(f"{name}: not scraped by Prometheus")
        if f"127.0.0.1:{ports[2]}/readyz" not in " ".join(s.get("healthcheck", {}).get("test", [])):
            out.append(f"{name}: healthcheck does not ask its /readyz")
    out += _table_problems(services, config)
    rules = scrape.get("rule_files", [])
    mounts = services.get("prometheus", {}).get("volumes", [])
    if not rules or not any(m.startswith("./prometheus/alerts.yml:" + rules[0]) for m in mounts):
        out.append("prometheus: the alert rules of deploy/prometheus are not loaded")
    return out


def _table_problems(services: dict[str, Any], config: dict[str, Any]) -> list[str]:
    """Cluster brokers turn tables on only with one catalog they all share (docs/tables.md): here a SQLite
    file on a volume every broker mounts at the same path, and table files in the shared S3 bucket."""
    tables = config.get("tables", {})
    uri = tables.get("catalog_uri", "")
    if not uri:
        return ["the brokers' config names no tables.catalog_uri: set-table --format iceberg is refused"]
    out = []
    if uri.startswith("sqlite:///"):
        directory = str(PurePosixPath(uri.removeprefix("sqlite:///")).parent)
        sources = set()
        for name in BROKERS:
            mounts = dict(reversed(v.split(":")[:2]) for v in services.get(name, {}).get("volumes", []))
            if directory not in mounts:
                out.append(f"{name}: does not mount the tables catalog's directory {directory}")
            elif mounts[directory] == name or mounts[directory].startswith("./"):
                out.append(f"{name}: its tables catalog's directory is not a volume the brokers share")
            else:
                sources.add(mounts[directory])
        if len(sources) > 1:
            out.append(f"the brokers mount different volumes at {directory}: {sorted(sources)}")
    durable = config.get("storage", {}).get("durable", {}).get("url", "")
    warehouse = tables.get("warehouse") or f"{durable}/tables"
    if not warehouse.startswith("s3://"):
        out.append(f"the tables warehouse {warehouse} is not the shared S3 bucket")
    return out


def test_the_image_makes_the_shared_catalog_directory_the_brokers_own() -> None:
    """A new named volume takes the owner of the image's directory it is mounted on: without the directory
    (owned by ister) in the image, the catalog volume would be root's and the broker could not write it."""
    config = yaml.safe_load(compose()["configs"]["ister-config"]["content"])
    directory = str(PurePosixPath(config["tables"]["catalog_uri"].removeprefix("sqlite:///")).parent)
    run = " ".join((DEPLOY / "Containerfile").read_text().split())
    made = re.search(r"mkdir -p ([^&]+) && chown ister:ister ([^&\n]+?)(?: &&|$| COPY)", run)
    assert made is not None, "the Containerfile makes no directory for ister"
    assert directory in made.group(1).split() and directory in made.group(2).split()


def test_the_committed_compose_file_is_what_ister_dev_compose_prints() -> None:
    assert (DEPLOY / "compose.yaml").read_text() == compose_yaml(), (
        "deploy/compose.yaml is stale: run `ister dev compose > deploy/compose.yaml`"
    )


def test_every_service_port_and_healthcheck_is_there() -> None:
    doc = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    assert problems(doc) == []
    assert list(doc["services"]) == SERVICES


@pytest.mark.parametrize(
    ("break_it", "expected"),
    [
        (lambda d: d["services"].pop("broker-2"), "service broker-2 missing"),
        (lambda d: d["services"].pop("etcd-3"), "service etcd-3 missing"),
        (lambda d: d["services"]["broker-1"].pop("healthcheck"), "broker-1: no healthcheck"),
        (lambda d: d["services"]["seaweedfs"].pop("healthcheck"), "seaweedfs: no healthcheck"),
        (lambda d: d["services"]["broker-0"]["ports"].pop(), "broker-0: ports [9040] not published"),
        (lambda d: d["services"]["seaweedfs"].pop("ports"), "seaweedfs: S3 port not published"),
        (lambda d: d["volumes"].pop("broker-0"), "broker-0: volume broker-0 not declared"),
        (lambda d: d["configs"].pop("ister-config"), "broker-0: config ister-config not declared"),
        (
            lambda d: d["services"]["broker-1"]["volumes"].pop(),
            "broker-1: does not mount the tables catalog's directory /catalog",
        ),
        (
            lambda d: d["configs"]["ister-config"].update(content="cluster: {replication_factor: 3}\n"),
            "the brokers' config names no tables.catalog_uri: set-table --format iceberg is refused",
        ),
    ],
)
def test_the_checks_fail_when_something_is_missing(break_it: Any, expected: str) -> None:
    doc = copy.deepcopy(compose())
    break_it(doc)
    assert expected in problems(doc)


def test_the_brokers_run_what_ister_dev_up_runs(tmp_path: Path) -> None:
    """The same flags in the same order and the same config, only other addresses and paths."""
    doc = compose()
    dev = DevCluster(tmp_path, Plan(3, True, plan_ports(3, None)), lambda _: None)
    for i, name in enumerate(BROKERS):
        in_compose = doc["services"][name]["command"]
        on_machine = dev.brokers[i].args()[1:]  # after `broker`
        assert [a for a in in_compose if a.startswith("--") and a != "--advertised-addr"] == [
            a for a in on_machine if a.startswith("--")
        ]
        # The ports are the same ones.
        for f in ("--broker-addr", "--admin-addr", "--prom-exporter"):
            assert flag(in_compose, f).rsplit(":", 1)[1] == flag(on_machine, f).rsplit(":", 1)[1]
        assert in_compose[-len(BrokerPlan(3, []).args(CONFIG_PATH)) :][:2] == ["--mode", "cluster"]
    on_machine_config = dev.broker_plan.config()
    in_compose_config = yaml.safe_load(doc["configs"]["ister-config"]["content"])
    on_machine_config["storage"]["durable"]["options"]["endpoint"] = "http://seaweedfs:8333"
    # The shared catalog: a SQLite file in the cluster's directory, here on a volume every broker mounts.
    assert on_machine_config["tables"]["catalog_uri"].startswith("sqlite:///")
    on_machine_config["tables"]["catalog_uri"] = "sqlite:////catalog/catalog.db"
    assert in_compose_config == on_machine_config
    # SeaweedFS: the same flags (the same ports), other directories and addresses.
    weed = doc["services"]["seaweedfs"]["command"]
    assert dev.s3 is not None
    from ister.devcluster.seaweed import mini_args

    local = mini_args("/d", "/t", "/c", dev.s3.ports, dev.s3.bucket)
    strip = re.compile(
        r"^-(dir|ip|ip\.bind|filer\.localSocket|s3\.localSocket|s3\.localFilerSocket|s3\.config)="
    )
    assert [a for a in weed if not strip.match(a)] == [a for a in local if not strip.match(a)]
    json.loads(doc["configs"]["s3-identities"]["content"])


def test_grafana_is_provisioned_with_the_prometheus_and_the_dashboard() -> None:
    provisioning = DEPLOY / "grafana" / "provisioning"
    sources = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    (source,) = sources["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    assert "9090:9090" in compose()["services"]["prometheus"]["ports"]
    providers = yaml.safe_load((provisioning / "dashboards" / "ister.yml").read_text())
    (provider,) = providers["providers"]
    mounts = compose()["services"]["grafana"]["volumes"]
    dashboard = next(m for m in mounts if m.startswith("./grafana/ister-cluster.json:"))
    assert dashboard.split(":")[1].startswith(provider["options"]["path"] + "/")
    assert json.loads((DEPLOY / "grafana" / "ister-cluster.json").read_text())["uid"] == "ister-cluster"


def test_the_brokers_config_names_one_shared_catalog_and_warehouse(tmp_path: Path) -> None:
    """The compose brokers' ister.yml, loaded and resolved as a broker does: one SQLite catalog on the
    shared volume, table files in the shared bucket (not the data directory's defaults)."""
    from ister.config import load_config
    from ister.tables.catalog import spec_for

    path = tmp_path / "ister.yml"
    path.write_text(compose()["configs"]["ister-config"]["content"])
    config = load_config(path, overrides={"mode": "cluster"}, environ={})
    spec = spec_for(config, Path("/data"))
    assert spec.uri == "sqlite:////catalog/catalog.db"
    assert spec.warehouse == "s3://ister-dev/tables"
    assert spec.properties["s3.endpoint"] == "http://seaweedfs:8333"
