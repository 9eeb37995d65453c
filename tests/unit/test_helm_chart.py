"""deploy/helm/ister: rendered by Helm's own engine, every object valid for Kubernetes, nothing missing.

Rendering uses helm-python-sdk (Helm v4's Go SDK through a C library, no helm binary or cluster), so the
templates are the Go templates `helm install` runs. Each rendered object is validated against the
Kubernetes OpenAPI schemas (kubernetes-validate, strict: unknown fields fail). `problems()` lists what a
broker cluster needs (PVC per broker, probes, ports, PDB, drain, DNS identity): the shipped chart has
none, and copies of the chart with one part removed each get it named.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import trustme
import yaml

from ister.config import load_config
from ister.tables.catalog import spec_for

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "ister"
KUBE_VERSION = "1.37.0"  # the newest schemas kubernetes-validate ships; the chart needs >= 1.25
BASE_VALUES: dict[str, Any] = {
    "etcd": {"endpoints": ["etcd-0.etcd:2379", "etcd-1.etcd:2379", "etcd-2.etcd:2379"]},
    "s3": {
        "url": "s3://ister/prod",
        "endpoint": "http://seaweedfs-s3:8333",
        "allowHttp": True,
        "credentialsSecret": "ister-s3",
    },
    "serviceMonitor": {"enabled": True},
}
SECURED: dict[str, Any] = {
    **BASE_VALUES,
    "tls": {"enabled": True, "secretName": "ister-tls", "mutual": True, "metrics": True},
    "auth": {"enabled": True, "jwtSecretName": "ister-jwt", "superusers": ["ops"]},
    "etcd": {**BASE_VALUES["etcd"], "tls": {"secretName": "etcd-client"}},
}
POD_ENV = {"POD_NAME": "demo-ister-1", "POD_IP": "10.1.2.3"}


def render(values: dict[str, Any], chart: Path = CHART) -> list[dict[str, Any]]:
    manifests = helm.Chart.load(str(chart)).render(values, name="demo", namespace="msg", is_install=True)
    objects: list[dict[str, Any]] = []
    for path, text in sorted(manifests.items()):
        if path.endswith(".yaml"):
            objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def _container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (sts,) = by_kind(objects, "StatefulSet")
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    return container  # type: ignore[no-any-return]


def _probe_problems(container: dict[str, Any], ports: dict[str, int]) -> list[str]:
    out = []
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = container.get(probe, {}).get("httpGet", {})
        if get.get("path") != path or get.get("port") not in ("metrics", ports.get("metrics")):
            out.append(f"{probe} is not GET {path} on the metrics port")
    return out


def _lifecycle_problems(container: dict[str, Any]) -> list[str]:
    pre = " ".join(container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", []))
    if "ister admin brokers drain" not in pre or "--wait" not in pre:
        return ["no preStop that drains the broker and waits"]
    return []


def _env_problems(container: dict[str, Any], objects: list[dict[str, Any]]) -> list[str]:
    env = {e["name"]: e.get("value", "") for e in container.get("env", [])}
    headless = [s for s in by_kind(objects, "Service") if s["spec"].get("clusterIP") == "None"]
    if not headless or f"$(POD_NAME).{headless[0]['metadata']['name']}." not in env.get(
        "ISTER_ADVERTISED_ADDR", ""
    ):
        return ["the advertised address is not the pod's name under the headless service"]
    if not env.get("ISTER_ADMIN_ADDR", "").startswith("$(POD_IP):"):
        return ["peers cannot reach the admin address (not the pod's IP)"]
    return []


def _service_problems(objects: list[dict[str, Any]], ports: dict[str, int]) -> list[str]:
    out = []
    services = by_kind(objects, "Service")
    headless = [s for s in services if s["spec"].get("clusterIP") == "None"]
    if not headless or not headless[0]["spec"].get("publishNotReadyAddresses"):
        out.append("no headless service publishing not-ready brokers")
    if not [s for s in services if s["spec"].get("clusterIP") != "None"]:
        out.append("no client service")
    for service in services:
        named = {p["name"]: p["port"] for p in service["spec"]["ports"]}
        if named != ports:
            out.append(f"service {service['metadata']['name']} ports {named} != container ports {ports}")
    return out


def problems(objects: list[dict[str, Any]]) -> list[str]:
    """What keeps the rendered chart from running a broker cluster ([] when nothing)."""
    out: list[str] = []
    sets = by_kind(objects, "StatefulSet")
    if len(sets) != 1:
        return [f"{len(sets)} StatefulSets"]
    sts = sets[0]
    container = _container(objects)
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    if set(ports) != {"client", "admin", "metrics"}:
        out.append(f"container ports {sorted(ports)}")
    claims = [c["metadata"]["name"] for c in sts["spec"].get("volumeClaimTemplates", [])]
    mounts = {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}
    if not claims or mounts.get(claims[0]) != "/data":
        out.append("no PVC per broker mounted at /data")
    out += _probe_problems(container, ports)
    out += _lifecycle_problems(container)
    out += _env_problems(container, objects)
    out += _service_problems(objects, ports)
    labels = sts["spec"]["template"]["metadata"]["labels"]
    pdbs = by_kind(objects, "PodDisruptionBudget")
    if not pdbs or not all(labels.get(k) == v for k, v in pdbs[0]["spec"]["selector"]["matchLabels"].items()):
        out.append("no PodDisruptionBudget over the brokers")
    return out


@pytest.mark.parametrize("values", [BASE_VALUES, SECURED], ids=["plain", "tls-auth-etcd-tls"])
def test_every_rendered_object_is_valid_kubernetes(values: dict[str, Any]) -> None:
    objects = render(values)
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == [
        "ConfigMap",
        "PodDisruptionBudget",
        "Service",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
        "StatefulSet",
    ]
    for obj in objects:
        if obj["apiVersion"] == "monitoring.coreos.com/v1":
            continue  # a CRD of the Prometheus Operator: no schema in Kubernetes' OpenAPI
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
    assert problems(objects) == []


def test_helm_lint_passes_strict() -> None:
    report = helm.lint(str(CHART), BASE_VALUES, strict=True)
    assert report["errors"] == [], report
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report["messages"]


@pytest.mark.parametrize("values", [BASE_VALUES, SECURED], ids=["plain", "tls-auth-etcd-tls"])
def test_the_rendered_config_loads_with_the_pod_environment(values: dict[str, Any], tmp_path: Path) -> None:
    """ister.yml from the ConfigMap plus the container's ISTER_* variables, as the broker will load them."""
    objects = render(values)
    (config_map,) = by_kind(objects, "ConfigMap")
    path = tmp_path / "ister.yml"
    # The Secrets' files, where the pod mounts them (under tmp_path): the loader checks they exist.
    path.write_text(config_map["data"]["ister.yml"].replace("/etc/ister/", f"{tmp_path}/etc/ister/"))
    _mounted_secrets(tmp_path / "etc" / "ister")
    env = {}
    for item in _container(objects)["env"]:
        if item["name"].startswith("ISTER_"):
            value = item["value"]
            for name, real in POD_ENV.items():
                value = value.replace(f"$({name})", real)
            env[item["name"]] = value
    ignored: list[str] = []
    config = load_config(path, environ=env, warn=ignored.append)
    assert ignored == []
    assert config.mode == "cluster" and config.data_dir == "/data"
    assert config.cluster.etcd_endpoints == values["etcd"]["endpoints"]
    assert config.storage.durable.url == "s3://ister/prod"
    assert config.storage.durable.options["endpoint"] == "http://seaweedfs-s3:8333"
    assert config.admin_addr == "10.1.2.3:50051"
    assert config.advertised_addr == "demo-ister-1.demo-ister-headless.msg.svc.cluster.local:6650"
    if values is SECURED:
        assert config.security.authentication and "ister-drain" in config.security.superusers
        assert config.broker_url.startswith("https://")
        assert config.cluster.etcd_tls.enabled


def test_a_shared_table_catalog_as_docs_deploy_md_sets_it(tmp_path: Path) -> None:
    """Cluster brokers refuse tables without one shared catalog (docs/tables.md); pods on several nodes
    share a REST catalog, set as values.yaml's comment and docs/deploy.md say: its URI in `config`, its
    credential from a Secret through `env`. Table files then go to the S3 bucket, under /tables."""
    secret_env = {
        "name": "ISTER_TABLES__CATALOG_PROPERTIES__CREDENTIAL",
        "valueFrom": {"secretKeyRef": {"name": "ister-catalog", "key": "credential"}},
    }
    values = {
        **BASE_VALUES,
        "config": {"tables": {"catalog_uri": "https://iceberg-rest.data.svc:8181/catalog"}},
        "env": [secret_env],
    }
    objects = render(values)
    for obj in objects:
        if obj["apiVersion"] != "monitoring.coreos.com/v1":
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
    container = _container(objects)
    assert secret_env in container["env"]
    (config_map,) = by_kind(objects, "ConfigMap")
    path = tmp_path / "ister.yml"
    path.write_text(config_map["data"]["ister.yml"])
    env = {i["name"]: i["value"] for i in container["env"] if i["name"].startswith("ISTER_") and "value" in i}
    env = {
        k: v.replace("$(POD_NAME)", "demo-ister-0").replace("$(POD_IP)", "10.1.2.3") for k, v in env.items()
    }
    env[secret_env["name"]] = "client-id:client-secret"  # what the kubelet puts there from the Secret
    config = load_config(path, environ=env)
    spec = spec_for(config, Path("/data"))
    assert spec.uri == "https://iceberg-rest.data.svc:8181/catalog"
    assert spec.warehouse == "s3://ister/prod/tables"
    assert spec.properties["credential"] == "client-id:client-secret"
    assert "credential" not in spec.public_properties()  # `ister table` does not print it


def _mounted_secrets(root: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("*.demo-ister-headless.msg.svc.cluster.local")
    for sub in ("tls", "etcd-tls", "jwt"):
        (root / sub).mkdir(parents=True)
    for sub in ("tls", "etcd-tls"):
        ca.cert_pem.write_to_path(str(root / sub / "ca.crt"))
    cert.private_key_pem.write_to_path(str(root / "tls" / "tls.key"))
    (root / "tls" / "tls.crt").write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
    (root / "jwt" / "secret").write_text("a-test-signing-secret-of-32-bytes!!\n")


def test_probes_use_https_when_the_metrics_port_has_tls() -> None:
    container = _container(render(SECURED))
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    pre = container["lifecycle"]["preStop"]["exec"]["command"][-1]
    assert "ISTER_TLS_CA=/etc/ister/tls/ca.crt" in pre and "--secret-file /etc/ister/jwt/secret" in pre


def test_the_service_monitor_scrapes_each_broker_once() -> None:
    objects = render(BASE_VALUES)
    (monitor,) = by_kind(objects, "ServiceMonitor")
    wanted = monitor["spec"]["selector"]["matchLabels"].items()
    chosen = [
        s for s in by_kind(objects, "Service") if all(s["metadata"]["labels"].get(k) == v for k, v in wanted)
    ]
    assert [s["spec"].get("clusterIP") for s in chosen] == ["None"]
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert by_kind(render({**BASE_VALUES, "serviceMonitor": {"enabled": False}}), "ServiceMonitor") == []


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({}, "etcd.endpoints is required"),
        ({**BASE_VALUES, "tls": {"enabled": True}}, "tls.enabled needs tls.secretName"),
        ({**BASE_VALUES, "auth": {"enabled": True}}, "auth.enabled needs tls.enabled"),
        (
            {**BASE_VALUES, "auth": {"enabled": True}, "tls": {"enabled": True, "secretName": "t"}},
            "auth.enabled needs auth.jwtSecretName",
        ),
    ],
)
def test_missing_required_values_fail_the_render_clearly(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmError, match=message):
        render(values)


def _cut(chart: Path, template: str, text: str) -> None:
    """Remove the line holding `text` and the block under it (the lines indented deeper)."""
    path = chart / "templates" / template
    lines = path.read_text().splitlines(keepends=True)
    (start,) = [i for i, line in enumerate(lines) if text in line]
    depth = len(lines[start]) - len(lines[start].lstrip())
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > depth):
        end += 1
    path.write_text("".join(lines[:start] + lines[end:]))


MUTATIONS = {
    "no PVC": ("statefulset.yaml", "  volumeClaimTemplates:", "PVC"),
    "no readiness probe": ("statefulset.yaml", "readinessProbe:", "readinessProbe"),
    "no liveness probe": ("statefulset.yaml", "livenessProbe:", "livenessProbe"),
    "no metrics port": ("statefulset.yaml", "- {name: metrics, containerPort", "container ports"),
    "no PDB": ("pdb.yaml", "kind: PodDisruptionBudget", "PodDisruptionBudget"),
    "no drain": ("statefulset.yaml", "preStop:", "preStop"),
    "no headless DNS": ("service-headless.yaml", "publishNotReadyAddresses: true", "headless"),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_a_chart_missing_a_part_is_caught(mutation: str, tmp_path: Path) -> None:
    """The checks above are not vacuous: remove one part from a copy of the chart and it is named."""
    chart = tmp_path / "ister"
    shutil.copytree(CHART, chart)
    template, text, expected = MUTATIONS[mutation]
    if mutation == "no PDB":
        (chart / "templates" / template).unlink()
    else:
        _cut(chart, template, text)
    found = problems(render(BASE_VALUES, chart))
    assert any(expected in p for p in found), found
