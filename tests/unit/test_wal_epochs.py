"""The replica epoch history file (storage/wal/epochs.py): round trip, missing, damaged, disk failures."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from crc32c import crc32c

from ister.core.replication import EpochHistory
from ister.errors import StorageError
from ister.storage.wal.epochs import EPOCHS_NAME, MAX_EPOCHS, encode, load_epochs, save_epochs


def history(*entries: tuple[int, int]) -> EpochHistory:
    return EpochHistory(list(entries))


def test_round_trip_and_replace(tmp_path: Path) -> None:
    assert load_epochs(tmp_path).status == "missing"
    save_epochs(tmp_path, history())
    loaded = load_epochs(tmp_path)
    assert (loaded.status, loaded.history.entries, loaded.problem) == ("ok", [], "")
    h = history((1, 0), (3, 120), (7, 4000))
    save_epochs(tmp_path, h)
    loaded = load_epochs(tmp_path)
    assert loaded.status == "ok" and loaded.history.entries == h.entries
    assert loaded.history.epoch_at(200) == 3
    h.truncate(4000)
    h.begin(8, 4000)
    save_epochs(tmp_path, h)
    assert load_epochs(tmp_path).history.entries == [(1, 0), (3, 120), (8, 4000)]
    assert sorted(p.name for p in tmp_path.iterdir()) == [EPOCHS_NAME]  # no tmp file left


def test_missing_and_damaged_are_told_apart(tmp_path: Path) -> None:
    missing = load_epochs(tmp_path)
    assert missing.status == "missing" and missing.history.entries == []
    save_epochs(tmp_path, history((1, 0), (2, 50)))
    path = tmp_path / EPOCHS_NAME
    good = path.read_bytes()
    cases = {
        "checksum": good[:-5] + bytes([good[-5] ^ 0x01]) + good[-4:],  # a flipped bit in an entry
        "short": good[:-7],  # a truncated file
        "empty": b"",
        "magic": b"X" + good[1:],
        "count": good[:8] + (99).to_bytes(4, "little") + good[12:],
    }
    for name, data in cases.items():
        path.write_bytes(data)
        loaded = load_epochs(tmp_path)
        assert loaded.status == "damaged", name
        assert loaded.history.entries == [], name  # treated as no history
        assert EPOCHS_NAME in loaded.problem, name


def test_an_unordered_history_is_refused_on_save_and_on_load(tmp_path: Path) -> None:
    for bad in (history((2, 0), (1, 10)), history((1, 10), (2, 10)), history((1, -1))):
        with pytest.raises(ValueError):
            save_epochs(tmp_path, bad)
    assert not (tmp_path / EPOCHS_NAME).exists()
    with pytest.raises(ValueError, match="at most"):
        encode(history(*((i, i) for i in range(MAX_EPOCHS + 1))))
    # a file with a valid checksum whose entries go backwards is damaged too
    data = bytearray(encode(history((1, 0), (2, 10))))
    data[12:20] = (5).to_bytes(8, "little")  # first epoch 5 > 2, then fix the checksum
    data[-4:] = crc32c(bytes(data[:-4])).to_bytes(4, "little")
    (tmp_path / EPOCHS_NAME).write_bytes(bytes(data))
    loaded = load_epochs(tmp_path)
    assert loaded.status == "damaged" and "ascend" in loaded.problem


@pytest.mark.parametrize("call", ["open", "write", "fsync", "rename"])
def test_a_failed_save_keeps_the_previous_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    save_epochs(tmp_path, history((1, 0)))

    def fail(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EIO, f"injected {call}")

    with monkeypatch.context() as patch:
        patch.setattr(os, call, fail)
        with pytest.raises(StorageError, match=f"injected {call}"):
            save_epochs(tmp_path, history((1, 0), (2, 9)))
    assert load_epochs(tmp_path).history.entries == [(1, 0)]
    assert sorted(p.name for p in tmp_path.iterdir()) == [EPOCHS_NAME]


def test_a_failed_directory_fsync_is_an_error_with_the_new_file_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save_epochs(tmp_path, history((1, 0)))
    real_fsync = os.fsync
    calls = 0

    def fsync(fd: int) -> None:
        nonlocal calls
        calls += 1
        if calls == 2:  # the file's fsync passes, the directory's fails
            raise OSError(errno.EIO, "injected dir fsync")
        real_fsync(fd)

    with monkeypatch.context() as patch:
        patch.setattr(os, "fsync", fsync)
        with pytest.raises(StorageError, match="injected dir fsync"):
            save_epochs(tmp_path, history((1, 0), (2, 9)))
    assert load_epochs(tmp_path).history.entries == [(1, 0), (2, 9)]  # renamed; saving again makes it durable


def test_an_unreadable_file_raises_instead_of_guessing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save_epochs(tmp_path, history((1, 0)))

    def read_bytes(self: Path) -> bytes:
        raise OSError(errno.EIO, "injected read")

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    with pytest.raises(StorageError, match="injected read"):
        load_epochs(tmp_path)
