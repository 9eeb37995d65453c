"""`record_gap` / `TopicStorage.skip_to` on a real WAL (issue 39's unclean recovery): the log continues
past a gap of offsets that must never be handed out again, its older records kept and readable, the gap
skipped by readers, and all of it still so after a reopen."""

from __future__ import annotations

from pathlib import Path

import pytest

from ister.storage.wal import Wal, WalConfig
from ister.storage.wal.checkpoint import read_checkpoint, record_gap


async def read_all(wal: Wal, start: int, end: int) -> list[tuple[int, bytes]]:
    reader = wal.reader(start)
    out: list[tuple[int, bytes]] = []
    while True:
        got = await reader.read(1000, 1 << 20, 0.05)
        assert isinstance(got, list)
        if not got:
            break
        out += [(o, bytes(r)) for o, r in got if o < end]
    reader.close()
    return out


async def test_a_wal_continues_past_a_recorded_gap_and_keeps_what_it_held(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path, WalConfig())
    await wal.append([b"a", b"b", b"c"])
    await wal.flush()
    await wal.close()
    record_gap(tmp_path, 3, 10)
    checkpoint = read_checkpoint(tmp_path)
    assert checkpoint is not None and checkpoint.next_offset == 10 and checkpoint.lost == ((3, 10),)
    wal = await Wal.open(tmp_path, WalConfig(), start_offset=10)
    try:
        assert (wal.first_offset, wal.next_offset) == (0, 10)
        assert wal.holes() == [(3, 10)]
        assert await wal.append([b"d"]) == 10
        await wal.flush()
    finally:
        await wal.close()
    wal = await Wal.open(tmp_path, WalConfig())  # reopened as after a restart: the gap is still known
    try:
        assert (wal.first_offset, wal.next_offset) == (0, 11)
        assert wal.holes() == [(3, 10)]
        assert await read_all(wal, 0, 20) == [(0, b"a"), (1, b"b"), (2, b"c"), (10, b"d")]
    finally:
        await wal.close()


def test_a_gap_joins_earlier_lost_ranges_and_nothing_is_recorded_for_an_empty_one(tmp_path: Path) -> None:
    record_gap(tmp_path, 5, 5)
    assert read_checkpoint(tmp_path) is None
    record_gap(tmp_path, 0, 4)
    record_gap(tmp_path, 2, 9)  # overlaps the first: only what lies past it is added
    checkpoint = read_checkpoint(tmp_path)
    assert checkpoint is not None and checkpoint.lost == ((0, 4), (4, 9)) and checkpoint.next_offset == 9


def test_a_failed_checkpoint_write_leaves_the_previous_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ister.storage.wal import checkpoint as module

    record_gap(tmp_path, 0, 4)

    def refuse(*_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(module, "replace_file", refuse)
    with pytest.raises(OSError):
        record_gap(tmp_path, 4, 9)
    checkpoint = read_checkpoint(tmp_path)
    assert checkpoint is not None and checkpoint.lost == ((0, 4),) and checkpoint.next_offset == 4
