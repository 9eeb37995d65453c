"""Segment file names: `<dir>/<first_offset:020d>.wal` (see docs/formats.md)."""

from __future__ import annotations

import os
import re
from pathlib import Path

SEGMENT_SUFFIX = ".wal"
_NAME_RE = re.compile(r"^(\d{20})\.wal$")


def segment_name(first_offset: int) -> str:
    return f"{first_offset:020d}{SEGMENT_SUFFIX}"


def parse_segment_name(name: str) -> int | None:
    m = _NAME_RE.match(name)
    return int(m.group(1)) if m else None


def list_segment_files(directory: Path) -> list[tuple[int, Path]]:
    """(first_offset, path) of every segment file, by first offset. Other files are ignored."""
    found: list[tuple[int, Path]] = []
    with os.scandir(directory) as it:
        for entry in it:
            first = parse_segment_name(entry.name)
            if first is not None and entry.is_file(follow_symlinks=False):
                found.append((first, Path(entry.path)))
    found.sort()
    return found


__all__ = ["SEGMENT_SUFFIX", "list_segment_files", "parse_segment_name", "segment_name"]
