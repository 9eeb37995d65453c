"""`ister_build_info{version,commit,python}` (always 1), the series that says what a broker runs."""

from __future__ import annotations

import functools
import json
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

from prometheus_client import Info

build_info = Info("ister_build", "The Ister build this process runs (value always 1)")


def version() -> str:
    try:
        return metadata.version("ister")
    except metadata.PackageNotFoundError:
        return "unknown"


@functools.cache
def commit() -> str:
    """The source commit: $ISTER_BUILD_COMMIT, the commit pip installed from, or the checkout's HEAD."""
    if env := os.environ.get("ISTER_BUILD_COMMIT", "").strip():
        return env[:40]
    try:
        direct = metadata.distribution("ister").read_text("direct_url.json")
        vcs = json.loads(direct).get("vcs_info", {}) if direct else {}
        if isinstance(vcs, dict) and isinstance(vcs.get("commit_id"), str):
            return str(vcs["commit_id"])[:12]
    except (metadata.PackageNotFoundError, ValueError):
        pass
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=2,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


def publish() -> None:
    """Set the series (once, at the metrics server's start)."""
    build_info.info({"version": version(), "commit": commit(), "python": platform.python_version()})
