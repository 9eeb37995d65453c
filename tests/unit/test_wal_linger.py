"""Group linger (storage/wal/writer.py, "Group linger"): a WAL whose appends come close together and in
flight together waits a moment before a flush so that one flush serves more of them; appends far apart, or
one at a time, are flushed at once. The linger here is long (50 ms) so that the tests see it plainly."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from ister.errors import StorageError
from ister.storage.wal import Wal, WalConfig, WriterPool
from ister.storage.wal.linger import GroupLinger
from ister.storage.wal.writer import Entry, WalWriter
from tests.unit.test_wal_pool import file_records

LINGER_US = 50_000


@pytest.fixture
def pool() -> object:
    pool = WriterPool(2, idle_close_s=30.0)
    yield pool
    assert pool.close(10)


async def _stream(wal: Wal, n: int, gap_s: float) -> list[int]:
    """`n` appends, a new one every `gap_s` without waiting for the earlier ones (producers in flight)."""
    tasks = []
    for i in range(n):
        tasks.append(asyncio.create_task(wal.append([b"m%d" % i])))
        await asyncio.sleep(gap_s)
    return list(await asyncio.gather(*tasks))


@pytest.fixture
def slow_disk(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A simulated slow disk: every fdatasync takes 3 ms more; counts them."""
    count = [0]
    real = WalWriter._fdatasync

    def slow(self: WalWriter) -> None:
        count[0] += 1
        time.sleep(0.003)
        real(self)

    monkeypatch.setattr(WalWriter, "_fdatasync", slow)
    return count


@pytest.mark.parametrize("linger_us", [0, LINGER_US])
async def test_appends_in_flight_faster_than_the_disk_share_flushes(
    tmp_path: Path, pool: WriterPool, slow_disk: list[int], linger_us: int
) -> None:
    wal = await Wal.open(tmp_path / "w", WalConfig(group_linger_us=linger_us), pool=pool, lock_root=tmp_path)
    try:
        assert await _stream(wal, 20, 0.0) == list(range(20))
        slow_disk[0] = 0
        # One append every ~0.5 ms, each flush 3 ms: without a linger a flush serves the handful that came
        # during the one before; with it, a flush serves what comes in 50 ms.
        assert await _stream(wal, 200, 0.0005) == list(range(20, 220))
        if linger_us:
            assert pool.lingers > 0
            assert slow_disk[0] <= 15, slow_disk[0]
        else:
            assert pool.lingers == 0
            assert slow_disk[0] >= 20, slow_disk[0]  # what the linger saves
    finally:
        await wal.close()
    payloads = [b"m%d" % i for i in range(20)] + [b"m%d" % i for i in range(200)]
    assert file_records(tmp_path / "w") == list(enumerate(payloads))


async def test_a_producer_that_waits_for_its_few_at_once_stops_being_held_back(
    tmp_path: Path, pool: WriterPool
) -> None:
    """Four sent at once, then waited for, again and again: the groups share and the gaps are small, but
    nothing comes while a thread waits. The writer stops waiting after a few tries, and tries once every
    LINGER_RETRY_AFTER turns."""
    wal = await Wal.open(tmp_path / "w", WalConfig(group_linger_us=LINGER_US), pool=pool, lock_root=tmp_path)
    try:
        offsets: list[int] = []
        for burst in range(60):
            offsets += await asyncio.gather(*(wal.append([b"m%d" % (4 * burst + k)]) for k in range(4)))
        assert offsets == list(range(240))
        assert 0 < pool.lingers <= 12, pool.lingers  # ~5 to learn it, then one per 16 turns
    finally:
        await wal.close()


async def test_what_keeps_a_writer_from_waiting(tmp_path: Path, pool: WriterPool) -> None:
    """The conditions of `WalWriter.lingers` one by one, from a state in which it would wait."""
    wal = await Wal.open(tmp_path / "w", WalConfig(group_linger_us=LINGER_US), pool=pool, lock_root=tmp_path)
    try:
        writer = wal._writer
        with pool.lock:

            def lingers_with(**state: object) -> bool:
                # the traffic's averages are the writer's GroupLinger's (linger.py), the rest the writer's
                owner = {name: writer.linger if name in GroupLinger.__slots__ else writer for name in state}
                saved = {name: getattr(owner[name], name) for name in state}
                writer._queue = [_entry()]
                writer.linger.sharing, writer.linger.gain, writer.linger.gap = 1.0, 1.0, LINGER_US / 2e6
                for name, value in state.items():
                    setattr(owner[name], name, value)
                try:
                    return writer.lingers()
                finally:
                    for name, value in saved.items():
                        setattr(owner[name], name, value)
                    writer._queue = []

            assert lingers_with() is True
            assert lingers_with(gap=2 * LINGER_US / 1e6) is False  # appends further apart than the linger
            assert lingers_with(sharing=0.0) is False  # one at a time
            assert lingers_with(gain=0.0, skipped=0) is False  # waiting brought nothing
            assert lingers_with(_queue=[_entry(), Entry(1, 0, b"", None, 0, None)]) is False  # flush marker
            assert lingers_with(_queue=[_entry()] * 64) is False  # plenty queued already
            assert lingers_with(_stopping=True) is False
            assert lingers_with(close_requested=True) is False
            assert lingers_with(_cut_request=(0, False)) is False
    finally:
        await wal.close()


def _entry() -> Entry:
    return Entry(0, 1, b"", [b""], 0, None)


async def test_one_append_at_a_time_is_never_held_back(tmp_path: Path, pool: WriterPool) -> None:
    """A producer that waits for each acknowledgement sends close together, but nothing could join its
    group: lingering would only slow it down."""
    wal = await Wal.open(tmp_path / "w", WalConfig(group_linger_us=LINGER_US), pool=pool, lock_root=tmp_path)
    try:
        for i in range(60):
            assert await wal.append([b"%d" % i]) == i
        assert pool.lingers == 0
    finally:
        await wal.close()


async def test_no_linger_when_off_or_in_interval_mode(tmp_path: Path, pool: WriterPool) -> None:
    for name, config in (
        ("off", WalConfig(group_linger_us=0)),
        ("interval", WalConfig(fsync="interval", group_linger_us=LINGER_US)),
    ):
        wal = await Wal.open(tmp_path / name, config, pool=pool, lock_root=tmp_path)
        try:
            await _stream(wal, 40, 0.0)
            await _stream(wal, 60, 0.0005)
        finally:
            await wal.close()
    assert pool.lingers == 0


async def test_a_flush_does_not_start_a_linger(
    tmp_path: Path, pool: WriterPool, slow_disk: list[int]
) -> None:
    wal = await Wal.open(tmp_path / "w", WalConfig(group_linger_us=LINGER_US), pool=pool, lock_root=tmp_path)
    await _stream(wal, 40, 0.0)
    await _stream(wal, 20, 0.0005)  # the writer lingers by now
    lingered = pool.lingers
    pending = [asyncio.create_task(wal.append([b"last-%d" % i])) for i in range(3)]
    await asyncio.sleep(0)
    await wal.flush()  # the flush marker joins the queue: no new linger starts for it
    assert all(t.done() for t in pending)
    assert pool.lingers - lingered <= 1  # at most the one already waiting when the marker came
    await wal.close()
    assert file_records(tmp_path / "w")[-3:] == [(60 + i, b"last-%d" % i) for i in range(3)]


def test_the_setting_is_checked() -> None:
    from ister.config import load_config
    from ister.errors import ConfigError

    with pytest.raises(ConfigError, match="group_linger_us"):
        WalConfig(group_linger_us=-1)
    with pytest.raises(ConfigError, match="group_linger_us"):
        load_config(environ={"ISTER_WAL__GROUP_LINGER_US": "-5"})
    assert load_config(environ={}).wal.group_linger_us == 400


async def test_a_disk_error_while_groups_linger_fails_only_unacknowledged_appends(
    tmp_path: Path, pool: WriterPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = [False]
    real = WalWriter._fdatasync

    def flaky(self: WalWriter) -> None:
        time.sleep(0.003)  # a slow disk, so that appends in flight share flushes
        if broken[0]:
            raise OSError(5, "simulated I/O error")
        real(self)

    monkeypatch.setattr(WalWriter, "_fdatasync", flaky)
    wal = await Wal.open(tmp_path / "w", WalConfig(group_linger_us=LINGER_US), pool=pool, lock_root=tmp_path)
    await _stream(wal, 20, 0.0)
    acknowledged = await _stream(wal, 60, 0.0005)
    assert pool.lingers > 0  # the writer waits for more appends by now
    tasks = [asyncio.create_task(wal.append([b"doomed-%d" % i])) for i in range(5)]
    await asyncio.sleep(0)
    broken[0] = True  # the disk fails while those wait for (or in) a lingering group
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, StorageError) for r in results), results
    assert wal.failed is not None
    await wal.close()
    broken[0] = False
    # Every acknowledged append is in the files, in order.
    records = file_records(tmp_path / "w")
    assert [offset for offset, _ in records[: 20 + len(acknowledged)]] == list(range(80))
