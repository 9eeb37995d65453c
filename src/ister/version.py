"""The package version, and the git commit it was built from when known (`ister --version`).

The commit comes from `ISTER_COMMIT` (set it when building an image from a clean tree), else from the git
checkout the package runs from (an editable install: `make install`), else it is unknown.
"""

from __future__ import annotations

import functools
import os
import subprocess
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from pathlib import Path

COMMIT_ENV = "ISTER_COMMIT"
GIT_TIMEOUT_SECONDS = 1.0


def version() -> str:
    try:
        return package_version("ister")
    except PackageNotFoundError:
        return "0+unknown"


@functools.cache
def commit() -> str | None:
    """The short commit hash, with `-dirty` when the checkout has changes; None when unknown."""
    from_env = os.environ.get(COMMIT_ENV, "").strip()
    if from_env:
        return from_env
    root = Path(__file__).resolve().parents[2]  # src/ister/version.py -> the checkout
    if not (root / ".git").exists():
        return None
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_SECONDS,
        )
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_SECONDS,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("-dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")


def describe() -> str:
    """`ister 0.1.0 (commit 1a2b3c4d5e6f)` or `ister 0.1.0`."""
    found = commit()
    return f"ister {version()}" + (f" (commit {found})" if found else "")
