"""The console's templates and static files ship in the wheel (no CDN, nothing fetched at run time): build
it with uv (about 1 s) and look for every file of the source tree's templates/ and static/ in it."""

from __future__ import annotations

import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONSOLE = ROOT / "src" / "ister" / "console"


def test_the_wheel_holds_every_console_template_and_static_file(tmp_path: Path) -> None:
    uv = ROOT / ".tools" / "bin" / "uv"
    found = str(uv) if uv.exists() else shutil.which("uv")
    if found is None:
        pytest.skip("uv is not installed: run `make install`")
    built = subprocess.run(
        [found, "build", "--wheel", "-o", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert built.returncode == 0, built.stderr
    [wheel] = tmp_path.glob("*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    wanted = {
        "ister/" + str(f.relative_to(ROOT / "src" / "ister"))
        for folder in ("templates", "static")
        for f in (CONSOLE / folder).rglob("*")
        if f.is_file()
    }
    assert {"ister/console/templates/base.html", "ister/console/static/live.js"} <= wanted
    assert wanted - shipped == set()
