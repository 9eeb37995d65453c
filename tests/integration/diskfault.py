"""Gray disk failures for real broker processes: `native/diskfault.c`, built here with the system's C
compiler and loaded with LD_PRELOAD, makes the flushes of files under a broker's data directory slow, or
fails them and their writes with EIO, on command (a control file), while the process runs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).parent / "native" / "diskfault.c"


def build_library(out_dir: Path) -> Path | None:
    """The preload library built into `out_dir`; None when no C compiler is installed."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        return None
    out = out_dir / "libdiskfault.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(out), str(SOURCE), "-ldl"], check=True)
    return out


class DiskFault:
    """One broker's disk: `env()` goes into its environment before it starts; then `slow`, `fail`, `heal`
    take effect within 50 ms."""

    def __init__(self, library: Path, control: Path, data_dir: Path) -> None:
        self.library = library
        self.control = control
        self.data_dir = data_dir
        self.heal()

    def env(self) -> dict[str, str]:
        return {
            "LD_PRELOAD": str(self.library),
            "DISKFAULT_CONTROL": str(self.control),
            "DISKFAULT_PREFIX": str(self.data_dir.resolve()),
        }

    def slow(self, ms: int) -> None:
        """Every fsync/fdatasync under the data directory waits `ms` first."""
        self._write(f"slow {ms}")

    def fail(self) -> None:
        """Every fsync/fdatasync and write under the data directory fails with EIO."""
        self._write("eio")

    def heal(self) -> None:
        self._write("ok")

    def _write(self, text: str) -> None:
        tmp = self.control.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(self.control)  # the library never reads half a command
