"""The dev directory's two files: `plan.json` (what the cluster is: brokers, S3 or not, ports; kept across
`up`s so data and addresses stay the same) and `state.json` (what runs now: the `up` process and each
service's pid and addresses; `ister dev status`, `down` and `restart-broker` read it)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from ister.devcluster.spec import Ports

PLAN = "plan.json"
STATE = "state.json"


@dataclass(frozen=True)
class Plan:
    brokers: int
    s3: bool
    ports: Ports

    def to_json(self) -> dict[str, Any]:
        return {"brokers": self.brokers, "s3": self.s3, "ports": self.ports.to_json()}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Plan:
        return cls(int(raw["brokers"]), bool(raw["s3"]), Ports.from_json(raw["ports"]))


def _write(path: Path, body: dict[str, Any]) -> None:
    """Whole or not at all: a reader never sees half a file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body, indent=2) + "\n")
    os.replace(tmp, path)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} cannot be read ({exc}); remove it or use --fresh") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path} does not hold a JSON object; remove it or use --fresh")
    return raw


def read_plan(directory: Path) -> Plan | None:
    raw = _read(directory / PLAN)
    try:
        return Plan.from_json(raw) if raw is not None else None
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{directory / PLAN} is not a dev plan ({exc}); use --fresh") from None


def write_plan(directory: Path, plan: Plan) -> None:
    _write(directory / PLAN, plan.to_json())


def read_state(directory: Path) -> dict[str, Any] | None:
    return _read(directory / STATE)


def write_state(directory: Path, state: dict[str, Any]) -> None:
    _write(directory / STATE, state)


def alive(pid: object, marker: str) -> bool:
    """Does process `pid` run, and is it the one recorded (its command line holds `marker`)? A pid the
    system gave to another program since is not ours."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return any(marker in part for part in proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
