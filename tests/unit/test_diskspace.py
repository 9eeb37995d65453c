"""The data disk's headroom (storage/diskspace.py): when publishes are refused, with which message, when
they are taken again, the per-publish budget between measurements, and statvfs failing or hanging."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from ister.config import load_config
from ister.errors import ConfigError
from ister.limits import GiB, MiB
from ister.storage import diskspace
from ister.storage.diskspace import DiskSpace, Headroom, human
from tests.support import until

BLOCK = 4096


def stat(free: int, total: int) -> os.statvfs_result:
    return os.statvfs_result((BLOCK, BLOCK, total // BLOCK, free // BLOCK, free // BLOCK, 0, 0, 0, 0, 255))


class FakeDisk:
    """statvfs of a disk whose free bytes the test sets; `error` is raised instead when set."""

    def __init__(self, free: int, total: int = 100 * MiB) -> None:
        self.free = free
        self.total = total
        self.error: OSError | None = None
        self.calls = 0

    def __call__(self, path: Path) -> os.statvfs_result:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return stat(self.free, self.total)


def gauge(name: str) -> float | None:
    return REGISTRY.get_sample_value(name)


def test_headroom_is_the_smaller_of_bytes_and_ratio() -> None:
    assert Headroom(GiB, 0.05).bytes_for(1000 * GiB) == GiB  # a big disk: the byte limit
    assert Headroom(GiB, 0.05).bytes_for(100 * MiB) == 5 * MiB  # a small one: 5 % of it
    assert Headroom(10 * MiB, 1.0).bytes_for(100 * MiB) == 10 * MiB  # ratio 1: the bytes alone
    assert Headroom(0, 0.05).bytes_for(100 * MiB) == 0  # off
    assert Headroom(GiB, 0.0).bytes_for(100 * MiB) == 0  # off


def test_human_sizes() -> None:
    assert human(512) == "512 B"
    assert human(3 * MiB + MiB // 2) == "3.5 MiB"
    assert human(GiB) == "1.0 GiB"


def test_config_defaults_and_validation() -> None:
    cfg = load_config(None, None, {})
    assert (cfg.storage.min_free_bytes, cfg.storage.min_free_ratio) == (GiB, 0.05)
    env = {"ISTER_STORAGE__MIN_FREE_BYTES": "8388608", "ISTER_STORAGE__MIN_FREE_RATIO": "1"}
    cfg = load_config(None, None, env)
    assert (cfg.storage.min_free_bytes, cfg.storage.min_free_ratio) == (8 * MiB, 1.0)
    with pytest.raises(ConfigError, match=r"storage.min_free_bytes must be >= 0.*ISTER_STORAGE__MIN_FREE"):
        load_config(None, None, {"ISTER_STORAGE__MIN_FREE_BYTES": "-1"})
    with pytest.raises(ConfigError, match=r"storage.min_free_ratio must be in 0..1"):
        load_config(None, {"storage.min_free_ratio": 1.5}, {})
    with pytest.raises(ConfigError, match="min_free_bytes"):
        load_config(None, None, {"ISTER_STORAGE__MIN_FREE_BYTES": "lots"})


def test_refuses_below_the_headroom_and_takes_again_with_a_margin_above(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    space = DiskSpace(tmp_path, Headroom(10 * MiB, 1.0))
    space.update(50 * MiB, 100 * MiB)
    assert space.refusal is None and space.room.is_set()
    assert gauge("ister_data_disk_free_bytes") == 50 * MiB
    assert gauge("ister_data_disk_headroom_bytes") == 10 * MiB
    with caplog.at_level(logging.WARNING, logger=diskspace.__name__):
        space.update(9 * MiB, 100 * MiB)
        space.update(8 * MiB, 100 * MiB)
    assert space.refusal is not None
    assert space.refusal.startswith("data disk has less than 10.0 MiB free (8.0 MiB of 100.0 MiB free")
    assert str(tmp_path) in space.refusal
    assert not space.room.is_set() and gauge("ister_data_disk_refusing") == 1
    assert space.take(1) == space.refusal  # nothing is taken while refusing
    space.update(10 * MiB + MiB // 2, 100 * MiB)  # at the headroom, but not a tenth above it
    assert space.refusal is not None
    with caplog.at_level(logging.WARNING, logger=diskspace.__name__):
        space.update(12 * MiB, 100 * MiB)
    assert space.refusal is None and space.room.is_set() and gauge("ister_data_disk_refusing") == 0
    logged = [r.getMessage() for r in caplog.records]
    assert sum("data disk has less than" in m for m in logged) == 1  # once per episode
    assert sum("publishes are accepted" in m for m in logged) == 1


def test_the_budget_refuses_between_measurements(tmp_path: Path) -> None:
    """A fast publisher is refused once its payloads since the last measurement reach the headroom, not
    a second later; the measurement it asks for (wake) decides again."""
    space = DiskSpace(tmp_path, Headroom(10 * MiB, 1.0))
    space.update(13 * MiB, 100 * MiB)
    assert space.take(2 * MiB) is None
    assert space.take(MiB) is None  # exactly at the headroom
    refusal = space.take(1)
    assert refusal is not None and "data disk has less than 10.0 MiB free" in refusal
    assert "13.0 MiB free, then about 3.0 MiB written" in refusal
    assert space._wake.is_set()  # measured at once
    space.update(20 * MiB, 100 * MiB)  # the writes were smaller on disk, or space was freed meanwhile
    assert space.refusal is None and space.take(9 * MiB) is None


def test_no_headroom_never_refuses(tmp_path: Path) -> None:
    space = DiskSpace(tmp_path, Headroom(0, 0.05))
    space.update(0, 100 * MiB)
    assert space.refusal is None and space.take(GiB) is None


async def test_background_measurement_follows_the_disk(tmp_path: Path) -> None:
    disk = FakeDisk(free=50 * MiB)
    space = DiskSpace(tmp_path, Headroom(10 * MiB, 1.0), interval=0.02, statvfs=disk)
    await space.start()
    try:
        assert space.refusal is None and space.free_bytes == 50 * MiB
        disk.free = 5 * MiB
        await until(lambda: space.refusal is not None, "refused below the headroom")
        disk.free = 30 * MiB
        await asyncio.wait_for(space.room.wait(), 5)
        assert space.refusal is None
    finally:
        await space.close()


async def test_a_failing_statvfs_keeps_the_last_state(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    disk = FakeDisk(free=5 * MiB)
    space = DiskSpace(tmp_path, Headroom(10 * MiB, 1.0), interval=0.01, statvfs=disk)
    await space.start()
    try:
        assert space.refusal is not None
        with caplog.at_level(logging.WARNING, logger=diskspace.__name__):
            disk.error = OSError(5, "Input/output error")
            calls = disk.calls
            await until(lambda: disk.calls > calls + 3, "statvfs asked again")
            assert space.refusal is not None  # still refusing: not known to have room
            disk.error, disk.free = None, 50 * MiB
            await until(lambda: space.refusal is None, "accepted once measured again")
        logged = [r.getMessage() for r in caplog.records]
        assert sum("cannot measure free space" in m for m in logged) == 1
        assert sum("is measured again" in m for m in logged) == 1
    finally:
        await space.close()


async def test_a_hung_statvfs_times_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(diskspace, "STATVFS_TIMEOUT_SECONDS", 0.05)
    release = threading.Event()

    def hung(path: Path) -> os.statvfs_result:
        release.wait(10)
        return stat(50 * MiB, 100 * MiB)

    space = DiskSpace(tmp_path, Headroom(10 * MiB, 1.0), statvfs=hung)
    space.update(5 * MiB, 100 * MiB)
    try:
        await asyncio.wait_for(space.refresh(), 2)  # returns after the timeout, state kept
        assert space.refusal is not None and space._error == "timed out"
    finally:
        release.set()
