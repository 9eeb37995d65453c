"""The high-water checkpoint file: two slots written in turn, torn slots, the v1 layout, crashes."""

from __future__ import annotations

import errno
import logging
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ister.storage.wal import Wal, WalConfig
from ister.storage.wal.checkpoint import (
    CHECKPOINT_NAME,
    MAX_LOST_RANGES,
    SLOT_RANGES,
    SLOT_SIZE,
    Checkpoint,
    CheckpointFile,
    decode_slot,
    encode,
    read_checkpoint,
    write_checkpoint,
)
from tests.support import until


def slots(directory: Path) -> list[tuple[int, Checkpoint] | str]:
    """Each slot's (seq, checkpoint), or why it does not decode."""
    data = (directory / CHECKPOINT_NAME).read_bytes()
    assert len(data) == 2 * SLOT_SIZE
    out: list[tuple[int, Checkpoint] | str] = []
    for i in (0, 1):
        try:
            out.append(decode_slot(data[i * SLOT_SIZE : (i + 1) * SLOT_SIZE]))
        except ValueError as exc:
            out.append(str(exc))
    return out


def damage(directory: Path, position: int) -> None:
    path = directory / CHECKPOINT_NAME
    data = bytearray(path.read_bytes())
    data[position] ^= 0x5A
    path.write_bytes(bytes(data))


def lost_ranges(n: int) -> tuple[tuple[int, int], ...]:
    return tuple((10 * i, 10 * i + 5) for i in range(n))


def test_writes_alternate_between_the_slots_and_the_newest_is_read(tmp_path: Path) -> None:
    file = CheckpointFile(tmp_path)
    file.write(Checkpoint(10))  # the first write makes the file: slot 0, seq 1
    assert slots(tmp_path) == [(1, Checkpoint(10)), "empty"]
    file.write(Checkpoint(20, ((3, 4),)))
    assert slots(tmp_path) == [(1, Checkpoint(10)), (2, Checkpoint(20, ((3, 4),)))]
    file.write(Checkpoint(30))
    assert slots(tmp_path) == [(3, Checkpoint(30)), (2, Checkpoint(20, ((3, 4),)))]
    assert read_checkpoint(tmp_path) == Checkpoint(30)
    assert sorted(p.name for p in tmp_path.iterdir()) == [CHECKPOINT_NAME]


@pytest.mark.parametrize("position", [0, 9, 20, 27, 31])
def test_a_torn_newest_slot_leaves_the_one_before(tmp_path: Path, position: int) -> None:
    file = CheckpointFile(tmp_path)
    for end in (10, 20, 30):  # slot 0 holds 30 (seq 3), slot 1 holds 20
        file.write(Checkpoint(end))
    damage(tmp_path, position)  # a byte of slot 0's magic, seq, offset, count or checksum
    assert read_checkpoint(tmp_path) == Checkpoint(20)


def test_both_slots_damaged_is_an_error_naming_each(tmp_path: Path) -> None:
    file = CheckpointFile(tmp_path)
    file.write(Checkpoint(10))
    file.write(Checkpoint(20))
    damage(tmp_path, 9)
    damage(tmp_path, SLOT_SIZE + 9)
    with pytest.raises(ValueError, match=r"slot 0: checksum mismatch; slot 1: checksum mismatch"):
        read_checkpoint(tmp_path)


def test_a_file_of_neither_layout_is_an_error(tmp_path: Path) -> None:
    (tmp_path / CHECKPOINT_NAME).write_bytes(b"\x00" * 100)
    with pytest.raises(ValueError, match="neither a v1 checkpoint nor two slots"):
        read_checkpoint(tmp_path)
    (tmp_path / CHECKPOINT_NAME).write_bytes(b"\x00" * (2 * SLOT_SIZE))
    with pytest.raises(ValueError, match="slot 0: empty; slot 1: empty"):
        read_checkpoint(tmp_path)


def test_a_v1_file_is_read_and_replaced_by_the_first_write(tmp_path: Path) -> None:
    (tmp_path / CHECKPOINT_NAME).write_bytes(encode(Checkpoint(77, ((5, 9),))))  # an older broker's file
    assert read_checkpoint(tmp_path) == Checkpoint(77, ((5, 9),))
    file = CheckpointFile(tmp_path)
    assert file.stage(Checkpoint(80)) is None  # never written in place: it must be replaced
    file.write(Checkpoint(80))
    assert slots(tmp_path) == [(1, Checkpoint(80)), "empty"]
    file.write(Checkpoint(90))
    assert read_checkpoint(tmp_path) == Checkpoint(90)


def test_more_lost_ranges_than_a_slot_holds_go_to_a_v1_file_and_back(tmp_path: Path) -> None:
    file = CheckpointFile(tmp_path)
    file.write(Checkpoint(1_000))
    many = Checkpoint(100_000, lost_ranges(SLOT_RANGES + 1))
    file.write(many)
    assert (tmp_path / CHECKPOINT_NAME).read_bytes()[:8] == b"ISTRHWM1"
    assert read_checkpoint(tmp_path) == many
    few = Checkpoint(100_001, lost_ranges(SLOT_RANGES))
    file.write(few)  # replaced: a v1 file is never written in place
    assert slots(tmp_path) == [(1, few), "empty"]
    file.write(Checkpoint(100_002, lost_ranges(3)))
    assert read_checkpoint(tmp_path) == Checkpoint(100_002, lost_ranges(3))
    # the v1 layout keeps the newest MAX_LOST_RANGES, as before
    file.write(Checkpoint(100_000, lost_ranges(MAX_LOST_RANGES + 5)))
    assert read_checkpoint(tmp_path) == Checkpoint(100_000, lost_ranges(MAX_LOST_RANGES + 5)[5:])


def test_a_deleted_file_is_made_again(tmp_path: Path) -> None:
    file = CheckpointFile(tmp_path)
    file.write(Checkpoint(10))
    (tmp_path / CHECKPOINT_NAME).unlink()
    file.write(Checkpoint(20))
    assert read_checkpoint(tmp_path) == Checkpoint(20)
    (tmp_path / CHECKPOINT_NAME).unlink()
    assert file.stage(Checkpoint(30)) is None  # the batched path replaces it then
    file.write(Checkpoint(30))
    assert read_checkpoint(tmp_path) == Checkpoint(30)


def test_a_replacement_behind_the_writers_back_is_not_overwritten_in_place(tmp_path: Path) -> None:
    file = CheckpointFile(tmp_path)
    for end in (10, 20, 30):
        file.write(Checkpoint(end))
    write_checkpoint(tmp_path, Checkpoint(25))  # a cut lowers the mark with a new file
    file.replaced()
    assert file.stage(Checkpoint(26)) is None
    file.write(Checkpoint(26))
    assert slots(tmp_path) == [(1, Checkpoint(26)), "empty"]


def test_random_torn_writes_never_give_anything_but_the_last_two_checkpoints(tmp_path: Path) -> None:
    rng = random.Random(1729)
    file = CheckpointFile(tmp_path)
    written: list[Checkpoint] = []
    for step in range(400):
        end = 10 * (step + 1)
        ckpt = Checkpoint(end, lost_ranges(rng.randrange(0, 4)) if end > 40 else ())
        file.write(ckpt)
        written.append(ckpt)
        if rng.random() < 0.3:
            # a torn write of the slot that would be written next: any prefix of it replaced with garbage
            data = bytearray((tmp_path / CHECKPOINT_NAME).read_bytes())
            newest = 0 if step % 2 == 0 else 1
            start = (1 - newest) * SLOT_SIZE
            cut = rng.randrange(1, SLOT_SIZE)
            data[start : start + cut] = rng.randbytes(cut)
            (tmp_path / CHECKPOINT_NAME).write_bytes(bytes(data))
        assert read_checkpoint(tmp_path) == ckpt  # the damaged slot never wins over the newest


KILLED_WRITER = r"""
import sys
from pathlib import Path
from ister.storage.wal.checkpoint import Checkpoint, CheckpointFile

file = CheckpointFile(Path(sys.argv[1]))
n = 0
while True:
    n += 1
    file.write(Checkpoint(n, ((0, 1),) if n > 1 else ()))
    print(n, flush=True)
"""


def test_kill_9_while_slots_are_written_keeps_the_last_acknowledged_checkpoint(tmp_path: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        for _ in range(250):  # each line: one more checkpoint written and flushed
            acknowledged = int(child.stdout.readline())
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    ckpt = read_checkpoint(tmp_path)
    assert ckpt is not None and ckpt.next_offset >= acknowledged


async def test_a_wal_reopens_at_the_older_mark_when_the_newest_slot_is_torn(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path, WalConfig())
    try:
        for i in range(30):
            await wal.append([b"r%d" % i])
    finally:
        await wal.close()
    file = CheckpointFile(tmp_path)
    file.write(Checkpoint(30))
    file.write(Checkpoint(60))  # a mark past the records: their offsets were handed out elsewhere
    damage(tmp_path, SLOT_SIZE + 12)  # slot 1 (seq 2, the newest) is torn: the mark is 30 again
    wal = await Wal.open(tmp_path, WalConfig())
    try:
        assert wal.next_offset == 30
        assert await wal.append([b"next"]) == 30
    finally:
        await wal.close()
    assert read_checkpoint(tmp_path) == Checkpoint(31)


def test_a_failed_flush_of_a_slot_keeps_the_other_and_is_retried_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = CheckpointFile(tmp_path)
    file.write(Checkpoint(10))
    file.write(Checkpoint(20))  # slot 0: 10, slot 1: 20 (the newest)
    real = os.fdatasync

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "simulated write-back error")

    monkeypatch.setattr(os, "fdatasync", failing)
    with pytest.raises(OSError, match="write-back"):
        file.write(Checkpoint(30))  # into slot 0, never known durable
    assert slots(tmp_path)[1] == (2, Checkpoint(20))  # the last durable checkpoint is untouched
    monkeypatch.setattr(os, "fdatasync", real)
    file.write(Checkpoint(40))  # retried into the same slot, over the one that failed
    assert slots(tmp_path) == [(3, Checkpoint(40)), (2, Checkpoint(20))]


async def test_a_wal_whose_checkpoint_cannot_be_written_keeps_taking_appends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr("ister.storage.wal.highwater.CHECKPOINT_INTERVAL_S", 0.0)
    caplog.set_level(logging.WARNING, logger="ister.storage.wal")  # whatever other tests left behind
    wal = await Wal.open(tmp_path, WalConfig())
    try:
        assert await wal.append([b"first"]) == 0
        await until(lambda: read_checkpoint(tmp_path) == Checkpoint(1), "the first checkpoint (a new file)")

        attempts = 0

        def failing(self: CheckpointFile, checkpoint: Checkpoint) -> int:
            nonlocal attempts
            attempts += 1
            raise OSError(errno.EIO, "simulated I/O error")

        monkeypatch.setattr(CheckpointFile, "_overwrite", failing)  # every in-place slot write fails
        for i in range(1, 20):
            assert await wal.append([b"r%d" % i]) == i  # acknowledged as usual
        await until(lambda: "cannot write the high-water checkpoint" in caplog.text, "the error logged")
        # The writer keeps retrying (the mark lags the committed offset): once it has failed a few more
        # times, the error is still logged only once.
        await until(lambda: attempts >= 3, lambda: f"3 failed checkpoint writes (saw {attempts})")
        assert read_checkpoint(tmp_path) == Checkpoint(1)  # the previous mark, still readable
        assert caplog.text.count("cannot write the high-water checkpoint") == 1  # once, not per attempt
        monkeypatch.undo()
        assert await wal.append([b"last"]) == 20
        await until(lambda: read_checkpoint(tmp_path) == Checkpoint(21), "the checkpoint written again")
        # The writer thread logs the recovery after the file is in place (or already did, if a retry wrote
        # the mark of 20 before the last append): wait for the line rather than expect it already there.
        await until(lambda: "high-water checkpoint written again" in caplog.text, "the recovery logged")
    finally:
        await wal.close()
    reopened = await Wal.open(tmp_path, WalConfig())
    try:
        assert reopened.next_offset == 21  # every acknowledged record is there
    finally:
        await reopened.close()
