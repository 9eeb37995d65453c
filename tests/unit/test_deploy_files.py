"""deploy/: the Containerfile's required parts, the example configs and the systemd unit (docs/deploy.md).

The image itself is built by deploy/build-image.sh, not here (minutes, and a container engine); this
checks the file it builds from. The example configs go through the real loader, so they stay valid as
settings change. `systemd-analyze verify` checks the unit where systemd is installed.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from ister.config import load_config

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CONTAINERFILE = DEPLOY / "Containerfile"
UNIT = DEPLOY / "systemd" / "ister-broker.service"
CONFIGS = DEPLOY / "config"


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction: continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        text = pending + line
        pending = ""
        word, _, rest = text.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def stages(found: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """The instructions of each build stage (from its FROM on)."""
    result: list[list[tuple[str, str]]] = []
    for item in found:
        if item[0] == "FROM":
            result.append([])
        if result:
            result[-1].append(item)
    return result


def env_of(stage: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for word, rest in stage:
        if word == "ENV":
            for pair in shlex.split(rest):
                key, _, value = pair.partition("=")
                env[key] = value
    return env


def test_containerfile_is_multi_stage_from_the_lock_file() -> None:
    found = instructions(CONTAINERFILE)
    assert found[0][0] == "ARG" and found[0][1].startswith("BASE_IMAGE="), "the base is a build argument"
    builder, final = stages(found)[0], stages(found)[-1]
    assert len(stages(found)) >= 2
    assert builder[0][1].endswith("AS builder") and "${BASE_IMAGE}" in builder[0][1]
    assert final[0][1] == "${BASE_IMAGE}", "the final stage runs the venv on the builder's base"
    runs = [rest for word, rest in builder if word == "RUN"]
    syncs = [r for r in runs if "uv sync" in r]
    assert syncs and all("--frozen" in r and "--no-dev" in r for r in syncs), syncs
    assert any("--no-editable" in r for r in syncs), "the final stage has no source tree"
    assert all("--extra tables" in r for r in syncs), "brokers in the image keep topics as Iceberg tables"
    copies = [rest for word, rest in builder if word == "COPY"]
    assert any("uv.lock" in c for c in copies)
    assert any(w == "COPY" and r.startswith("--from=builder /opt/ister") for w, r in final)


def test_the_final_stage_runs_the_broker_as_a_user_with_a_data_volume_and_a_healthcheck() -> None:
    final = stages(instructions(CONTAINERFILE))[-1]
    words = dict(final)  # the last of each instruction
    user = words["USER"]
    assert user not in ("root", "0") and not user.startswith(("root:", "0:")), user
    assert words["VOLUME"] in ("/data", '["/data"]')
    assert words["ENTRYPOINT"] == '["ister", "broker"]'
    assert set(words["EXPOSE"].split()) == {"6650", "50051", "9040"}
    health = words["HEALTHCHECK"]
    assert "/healthz" in health and "urllib" in health and "curl" not in health
    assert "ISTER_PROM_EXPORTER" in health, "the check asks the port the broker listens on"


def test_the_image_environment_names_real_settings() -> None:
    """Its ISTER_* defaults load with the real loader, ignored by none (one would be a typo)."""
    env = env_of(stages(instructions(CONTAINERFILE))[-1])
    ister = {k: v for k, v in env.items() if k.startswith("ISTER_")}
    assert ister["ISTER_DATA_DIR"] == "/data"
    ignored: list[str] = []
    config = load_config(None, environ=ister, warn=ignored.append)
    assert ignored == []
    assert config.data_dir == "/data" and config.prom_exporter == "0.0.0.0:9040"


def test_the_build_context_holds_what_the_containerfile_copies() -> None:
    """.containerignore keeps the context small (no .venv); every COPY source must stay in it."""
    allowed = {
        line[1:].rstrip("/")
        for line in (ROOT / ".containerignore").read_text().splitlines()
        if line.startswith("!")
    }
    for word, rest in instructions(CONTAINERFILE):
        if word == "COPY" and not rest.startswith("--from"):
            *sources, _dest = rest.split()
            for source in sources:
                assert source.rstrip("/") in allowed, f"{source} is excluded from the build context"
                assert (ROOT / source).exists()


@pytest.mark.parametrize("name", ["ister-standalone.yml", "ister-cluster.yml"])
def test_example_configs_load_with_the_real_loader(name: str) -> None:
    ignored: list[str] = []
    config = load_config(CONFIGS / name, environ={}, warn=ignored.append)
    assert ignored == []
    assert config.data_dir == "/var/lib/ister", "the unit's StateDirectory and ReadWritePaths"
    assert config.prom_exporter is not None
    assert config.prom_exporter.rpartition(":")[2] == _readiness_port(), "the unit's readiness check port"
    if name == "ister-cluster.yml":
        assert config.mode == "cluster" and len(config.cluster.etcd_endpoints) == 3
        assert config.cluster.replication_factor == 3
        assert (config.storage.durable.url or "").startswith("s3://")
        assert not config.admin_addr.startswith("0.0.0.0"), "peers call the admin address as registered"
    else:
        assert config.mode == "standalone"


def _unit() -> dict[str, list[str]]:
    """Each key's values (a key may repeat)."""
    out: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def _readiness_port() -> str:
    post = _unit()["ExecStartPost"][0]
    return post.rsplit(":", 1)[1]


def test_the_unit_is_hardened_and_waits_for_readiness() -> None:
    unit = _unit()
    expected = {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ReadWritePaths": "/var/lib/ister",
        "PrivateTmp": "yes",
        "ProtectHome": "yes",
        "StateDirectory": "ister",
        "User": "ister",
        "Type": "simple",
        "CapabilityBoundingSet": "",
    }
    for key, value in expected.items():
        assert unit.get(key) == [value], key
    assert unit["ExecStart"] == ["/opt/ister/bin/ister broker --config-file /etc/ister/ister.yml"]
    post = unit["ExecStartPost"][0]
    assert "ister-wait-ready" in post and re.search(r"--timeout \d+", post)
    # The check gives up before systemd does, so its own message (the broker's reasons) is logged.
    timeout = int(re.search(r"--timeout (\d+)", post).group(1))  # type: ignore[union-attr]
    assert timeout < int(unit["TimeoutStartSec"][0])


def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian package systemd)")
    # verify also checks that each command exists: the /opt/ister layout is made under tmp_path.
    for name in ("bin/ister", "bin/python3", "libexec/ister-wait-ready"):
        stub = tmp_path / "opt/ister" / name
        stub.parent.mkdir(parents=True, exist_ok=True)
        stub.write_text("#!/bin/sh\n")
        stub.chmod(0o755)
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace("/opt/ister/", f"{tmp_path}/opt/ister/"))
    verify = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert verify.returncode == 0 and verify.stderr == "", verify.stderr
    security = subprocess.run(
        [analyze, "security", "--offline=yes", str(unit)], capture_output=True, text=True, timeout=60
    )
    level = re.search(r"Overall exposure level for \S+: ([\d.]+)", security.stdout)
    assert level is not None, security.stdout[-500:] + security.stderr[-500:]
    assert float(level.group(1)) <= 2.5, security.stdout  # "OK" band; 1.9 when written
