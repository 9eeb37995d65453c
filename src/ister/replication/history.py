"""The epoch history kept next to a replica's WAL: (leader epoch, first offset written in it), ascending.

`<wal dir>/epochs.json`, written to a temporary file, fsync'd and renamed over the old one (blocking; run in a
thread). A missing file is an empty history; a damaged one also reads as empty, which makes the leader cut
the replica's log to where the histories agree, i.e. from the start: safe, never wrong.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
from pathlib import Path

from ister.core.replication import EpochHistory

log = logging.getLogger(__name__)

HISTORY_NAME = "epochs.json"


def history_path(wal_dir: Path) -> Path:
    return wal_dir / HISTORY_NAME


def load_history(wal_dir: Path) -> EpochHistory:
    path = history_path(wal_dir)
    try:
        raw = json.loads(path.read_text())
        entries = [(int(e), int(s)) for e, s in raw["entries"]]
    except FileNotFoundError:
        return EpochHistory()
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("%s is unreadable (%s): treated as an empty epoch history", path, exc)
        return EpochHistory()
    if any(b[0] <= a[0] or b[1] < a[1] for a, b in itertools.pairwise(entries)):
        log.warning("%s is not ascending: treated as an empty epoch history", path)
        return EpochHistory()
    return EpochHistory(entries)


def save_history(wal_dir: Path, history: EpochHistory) -> None:
    wal_dir.mkdir(parents=True, exist_ok=True)
    path = history_path(wal_dir)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"entries": history.entries}, f)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    fd = os.open(wal_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
