"""The shared WAL writer pool: many WALs on a few threads, segment files open only while written, one lock
root for many WALs, and running out of file descriptors refused as retriable (issue 14 item 2)."""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import grpc
import pytest

from ister.core.frames import scan_frames
from ister.errors import StorageError
from ister.storage.wal import Wal, WalConfig, WriterPool
from ister.storage.wal.checkpoint import (
    CHECKPOINT_NAME,
    SLOT_SIZE,
    TMP_NAME,
    Checkpoint,
    CheckpointFile,
    decode_slot,
    read_checkpoint,
    write_checkpoints,
)
from ister.wire.status import status_for
from tests.support import segment_bytes, until


def wal_fds(root: Path) -> list[str]:
    """This process's open descriptors on files or directories under `root`."""
    found = []
    prefix = os.path.realpath(root) + os.sep
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(prefix) or target == prefix[:-1]:
            found.append(target)
    return found


def file_records(directory: Path) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    for path in sorted(directory.glob("*.wal")):
        res = scan_frames(segment_bytes(path), expect_offset=int(path.stem))
        assert res.stop == "end", (path, res.stop)
        out.extend((o, bytes(p)) for o, p, _ in res.frames)
    return out


@pytest.fixture
def pool() -> object:
    pool = WriterPool(3, idle_close_s=30.0)
    yield pool
    assert pool.close(10)


async def test_many_wals_share_the_pool_threads_and_keep_their_order(
    tmp_path: Path, pool: WriterPool
) -> None:
    threads_before = threading.active_count()
    wals = [
        await Wal.open(tmp_path / f"w{i}", WalConfig(), pool=pool, lock_root=tmp_path) for i in range(300)
    ]
    try:

        async def writer(i: int, wal: Wal) -> list[int]:
            offsets = []
            for j in range(0, 20, 4):  # groups of appends in flight at once, several WALs per pool turn
                offsets += await asyncio.gather(*(wal.append([b"%d-%d" % (i, j + k)]) for k in range(4)))
            return offsets

        results = await asyncio.gather(*(writer(i, w) for i, w in enumerate(wals)))
        assert all(offsets == list(range(20)) for offsets in results)
        # a fixed number of threads whatever the number of WALs: the pool's, and asyncio's bounded
        # executor (recovery at open runs there)
        assert pool.stats()["threads"] == 3
        assert threading.active_count() <= threads_before + 3 + min(32, (os.cpu_count() or 1) + 4)
        assert pool.stats()["writers"] == 300
        for i, wal in enumerate(wals[:20]):
            assert file_records(wal.directory) == [(j, b"%d-%d" % (i, j)) for j in range(20)]
    finally:
        for wal in wals:
            await wal.close()
    assert pool.stats()["writers"] == 0


async def test_idle_segment_files_are_closed_and_reopened_on_demand(tmp_path: Path) -> None:
    pool = WriterPool(2, idle_close_s=0.2)
    wals = [await Wal.open(tmp_path / f"w{i}", WalConfig(), pool=pool, lock_root=tmp_path) for i in range(20)]
    try:
        # open, never written: one descriptor for all of them (the lock root), none per WAL
        assert len(wal_fds(tmp_path)) == 1
        for wal in wals:
            assert await wal.append([b"first"]) == 0
        await until(lambda: len(wal_fds(tmp_path)) == 1, "idle segment files to be closed")
        assert pool.stats()["open_files"] == 0
        for wal in wals:  # reopened for the next write
            assert await wal.append([b"second"]) == 1
        for wal in wals:
            assert file_records(wal.directory) == [(0, b"first"), (1, b"second")]
            assert await wal.reader(0).read(timeout=1) == [(0, b"first"), (1, b"second")]
    finally:
        for wal in wals:
            await wal.close()
        assert pool.close(10)
    assert wal_fds(tmp_path) == []  # the last close releases the lock root too


async def test_idle_close_in_interval_mode_syncs_first(tmp_path: Path) -> None:
    pool = WriterPool(2, idle_close_s=0.1)
    config = WalConfig(fsync="interval", fsync_interval_ms=60_000)  # no timed fdatasync in this test
    wal = await Wal.open(tmp_path / "w", config, pool=pool, lock_root=tmp_path)
    try:
        assert await wal.append([b"a", b"b"]) == 0
        assert wal.synced_offset == 0  # written, not yet fdatasync'd
        await until(lambda: wal.synced_offset == 2, "the idle close's fdatasync")
        await until(lambda: len(wal_fds(tmp_path)) == 1, "the idle close")
        assert await wal.append([b"c"]) == 2
        await wal.flush()
        assert file_records(tmp_path / "w") == [(0, b"a"), (1, b"b"), (2, b"c")]
    finally:
        await wal.close()
        assert pool.close(10)


async def test_open_segment_files_are_capped(tmp_path: Path) -> None:
    pool = WriterPool(2, idle_close_s=3600.0, max_open_files=8)
    wals = [await Wal.open(tmp_path / f"w{i}", WalConfig(), pool=pool, lock_root=tmp_path) for i in range(40)]
    try:
        for round_ in range(3):
            for wal in wals:
                assert await wal.append([b"r%d" % round_]) == round_
            # the least recently written beyond the cap are closed (right after their turn)
            await until(lambda: pool.stats()["open_files"] <= 8, "the open-file cap")
            await until(lambda: len(wal_fds(tmp_path)) <= 8 + 1, "descriptors under the cap")
        for wal in wals:
            assert file_records(wal.directory) == [(0, b"r0"), (1, b"r1"), (2, b"r2")]
    finally:
        for wal in wals:
            await wal.close()
        assert pool.close(10)


async def test_a_lock_root_keeps_other_processes_out_of_every_wal_under_it(tmp_path: Path) -> None:
    pool = WriterPool(1)
    a = await Wal.open(tmp_path / "ns" / "a", WalConfig(), pool=pool, lock_root=tmp_path)
    b = await Wal.open(tmp_path / "ns" / "b", WalConfig(), pool=pool, lock_root=tmp_path)
    script = textwrap.dedent(
        """
        import asyncio, sys
        from pathlib import Path
        from ister.errors import StorageError
        from ister.storage.wal import Wal
        async def main():
            root = Path(sys.argv[1])
            try:
                wal = await Wal.open(root / "ns" / "c", lock_root=root)
            except StorageError as exc:
                print("refused:", exc)
                return
            await wal.append([b"x"])
            await wal.close()
            print("opened")
        asyncio.run(main())
        """
    )

    def other_process() -> str:
        out = subprocess.run(
            [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
        return out.stdout

    try:
        assert len(wal_fds(tmp_path)) == 1  # one flock for both WALs
        assert "refused" in other_process() and "already open" in other_process()
        with pytest.raises(StorageError, match="already open"):
            await Wal.open(tmp_path / "ns" / "a", WalConfig(), pool=pool, lock_root=tmp_path)
        await a.close()
        assert "refused" in other_process()  # b still holds the root
    finally:
        await a.close()
        await b.close()
        assert pool.close(10)
    assert other_process().strip() == "opened"


def test_out_of_file_descriptors_is_refused_as_retriable_and_recovers(tmp_path: Path) -> None:
    """With the process at its descriptor limit, an append that must open its segment file is refused with
    RESOURCE_EXHAUSTED (offsets handed back, the WAL not failed); once descriptors are free it succeeds."""
    script = textwrap.dedent(
        """
        import asyncio, os, resource, sys
        from pathlib import Path
        from ister.errors import StorageExhausted
        from ister.storage.wal import Wal, WalConfig, WriterPool
        from ister.wire.status import status_for

        async def main():
            pool = WriterPool(1, idle_close_s=0.05)
            wal = await Wal.open(Path(sys.argv[1]), WalConfig(), pool=pool)
            assert await wal.append([b"a"]) == 0
            def segment_open():
                return any(
                    os.readlink(f"/proc/self/fd/{fd}").endswith(".wal")
                    for fd in os.listdir("/proc/self/fd")
                    if os.path.exists(f"/proc/self/fd/{fd}")
                )
            while segment_open():
                await asyncio.sleep(0.02)  # the idle segment file gets closed
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
            hog = []
            try:
                while True:
                    hog.append(os.open("/dev/null", os.O_RDONLY))
            except OSError:
                pass
            try:
                await wal.append([b"b"])
                print("no error")
            except StorageExhausted as exc:
                print("refused", exc.retriable, status_for(exc).name, wal.failed is None, wal.next_offset)
            for fd in hog:
                os.close(fd)
            print("after", await wal.append([b"c"]), wal.committed_offset)
            await wal.close()
            pool.close(10)

        asyncio.run(main())
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "w")], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "refused True RESOURCE_EXHAUSTED True 1", out.stdout + out.stderr
    assert lines[1] == "after 1 2"
    assert "too many open files" in out.stderr  # logged once for the episode


def test_storage_exhausted_maps_to_resource_exhausted() -> None:
    from ister.errors import DiskFull, StorageExhausted

    for err in (StorageExhausted("x"), DiskFull("y")):
        assert err.retriable
        assert status_for(err) == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_the_checkpoint_budget_spaces_out_checkpoints_beyond_a_burst() -> None:
    from ister.storage.wal.pool import CHECKPOINTS_PER_SECOND

    pool = WriterPool(1, shared_sync=False)
    now = 1000.0
    slots = [pool.reserve_checkpoint(now) for _ in range(CHECKPOINTS_PER_SECOND + 50)]
    assert slots[:CHECKPOINTS_PER_SECOND] == [now] * CHECKPOINTS_PER_SECOND  # a second's worth at once
    step = 1.0 / CHECKPOINTS_PER_SECOND
    assert slots[-1] == pytest.approx(now + 50 * step)  # then spaced out
    assert pool.reserve_checkpoint(now + 10) == now + 10  # the budget refills


def test_with_a_shared_sync_spaced_out_checkpoints_fall_due_in_groups() -> None:
    from ister.storage.wal import durable
    from ister.storage.wal.pool import CHECKPOINT_GROUP, CHECKPOINTS_PER_SECOND

    if durable.syncfs is None:
        pytest.skip("no usable syncfs(2) on this platform")
    pool = WriterPool(1)
    now = 1000.0
    n = CHECKPOINTS_PER_SECOND + 4 * CHECKPOINT_GROUP
    slots = [pool.reserve_checkpoint(now) for _ in range(n)]
    assert slots[:CHECKPOINTS_PER_SECOND] == [now] * CHECKPOINTS_PER_SECOND  # the burst is not delayed
    later = slots[CHECKPOINTS_PER_SECOND:]
    assert later == sorted(later)
    groups = {t: later.count(t) for t in later}
    assert len(groups) <= 5 and max(groups.values()) == CHECKPOINT_GROUP  # a few times, many at each
    # the average rate is still the budget's: the last slot is at most one group later than without groups
    step = 1.0 / CHECKPOINTS_PER_SECOND
    assert now + (n - CHECKPOINTS_PER_SECOND) * step <= later[-1] + 1e-9
    assert later[-1] <= now + (n - CHECKPOINTS_PER_SECOND + CHECKPOINT_GROUP) * step + 1e-9


async def test_every_wal_gets_its_checkpoint_when_many_are_written_at_once(tmp_path: Path) -> None:

    pool = WriterPool(4)
    wals = [
        await Wal.open(tmp_path / f"w{i}", WalConfig(), pool=pool, lock_root=tmp_path) for i in range(150)
    ]
    try:
        await asyncio.gather(*(wal.append([b"x"]) for wal in wals))

        def all_recorded() -> bool:
            return all((c := read_checkpoint(w.directory)) is not None and c.next_offset == 1 for w in wals)

        await until(all_recorded, "every WAL's checkpoint")
    finally:
        for wal in wals:
            await wal.close()
        assert pool.close(10)


# ---- one syncfs for a batch of WALs (shared_sync) -----------------------------------------------------


class SyncCounter:
    """Counts the pool's syncfs calls and the writers' own fdatasyncs; `syncfs_error` makes syncfs fail."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, syncfs_error: int | None = None) -> None:
        from ister.storage.wal import durable
        from ister.storage.wal.writer import WalWriter

        real_syncfs = durable.syncfs
        assert real_syncfs is not None
        real_fdatasync = WalWriter._fdatasync
        self.syncfs_calls = 0
        self.fdatasyncs: list[Path] = []
        self.failing: set[Path] = set()  # WAL directories whose fdatasync fails with EIO

        def syncfs(fd: int) -> None:
            self.syncfs_calls += 1
            if syncfs_error is not None:
                raise OSError(syncfs_error, os.strerror(syncfs_error))
            real_syncfs(fd)

        def fdatasync(writer: WalWriter) -> None:
            directory = writer._directory
            self.fdatasyncs.append(directory)
            if directory in self.failing:
                raise OSError(5, "simulated I/O error")
            real_fdatasync(writer)

        monkeypatch.setattr(durable, "syncfs", syncfs)
        monkeypatch.setattr(WalWriter, "_fdatasync", fdatasync)


async def queued_behind_one_turn(
    monkeypatch: pytest.MonkeyPatch, wals: list[Wal], payload: bytes = b"x"
) -> list[asyncio.Future[int]]:
    """Append to every WAL while the pool's one thread is held inside the first WAL's turn, so that the
    others wait for the next turn together (one batch); returns the appends."""
    from ister.storage.wal.writer import WalWriter

    entered, gate = threading.Event(), threading.Event()
    original = WalWriter._write_group

    def held_once(self: WalWriter, *args: object) -> None:
        if not entered.is_set():
            entered.set()
            assert gate.wait(10)
        original(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(WalWriter, "_write_group", held_once)
    first = asyncio.ensure_future(wals[0].append([payload]))
    await until(entered.is_set, "the first WAL's turn")
    rest = [asyncio.ensure_future(wal.append([payload])) for wal in wals[1:]]
    await asyncio.sleep(0)  # every append submitted (each queues its entry at once)
    gate.set()
    return [first, *rest]


@pytest.fixture
def shared_pool() -> object:
    from ister.storage.wal import durable

    if durable.syncfs is None:
        pytest.skip("no usable syncfs(2) on this platform")
    pool = WriterPool(1, idle_close_s=30.0)  # one thread: the held turn keeps every other WAL waiting
    yield pool
    assert pool.close(10)


async def open_wals(tmp_path: Path, pool: WriterPool, n: int) -> list[Wal]:
    return [await Wal.open(tmp_path / f"w{i}", WalConfig(), pool=pool, lock_root=tmp_path) for i in range(n)]


async def checkpoints_recorded(wals: list[Wal], end: int) -> None:
    """Wait until every WAL's checkpoint says `end` (they are written after the appends complete) and its
    writer has recorded it as durable. The file says `end` before the syncfs that makes it durable (and that
    the tests count) has run: only the writer's mark, set after it, means the pool is done with it."""

    def recorded(w: Wal) -> bool:
        c = read_checkpoint(w.directory)
        return c is not None and c.next_offset == end and w._writer.checkpoints.mark == end

    await until(lambda: all(recorded(w) for w in wals), "every WAL's checkpoint")


async def test_one_syncfs_makes_a_batch_of_wals_durable(
    tmp_path: Path, shared_pool: WriterPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    wals = await open_wals(tmp_path, shared_pool, 20)
    counter = SyncCounter(monkeypatch)
    try:
        appends = await queued_behind_one_turn(monkeypatch, wals)
        assert await asyncio.gather(*appends) == [0] * 20
        await checkpoints_recorded(wals, 1)
        # the held turn had one WAL (its own fdatasync); the other 19 came as one batch: one syncfs for
        # their records, two for their checkpoints
        assert counter.syncfs_calls == 3
        assert counter.fdatasyncs == [wals[0].directory]
        for wal in wals:
            assert wal.synced_offset == 1
            assert file_records(wal.directory) == [(0, b"x")]
    finally:
        for wal in wals:
            await wal.close()


async def test_a_failed_syncfs_falls_back_to_an_fdatasync_per_file(
    tmp_path: Path, shared_pool: WriterPool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    wals = await open_wals(tmp_path, shared_pool, 10)
    counter = SyncCounter(monkeypatch, syncfs_error=5)  # EIO: some file's write-back failed
    try:
        appends = await queued_behind_one_turn(monkeypatch, wals)
        assert await asyncio.gather(*appends) == [0] * 10
        await checkpoints_recorded(wals, 1)
        assert counter.syncfs_calls == 2  # the records' and the checkpoints': both failed
        assert sorted(counter.fdatasyncs) == sorted(w.directory for w in wals)  # each file's own, instead
        assert "syncfs failed" in caplog.text
        assert shared_pool.shared_sync  # a failed write-back is not a reason to stop using it
        assert all(w.failed is None and w.synced_offset == 1 for w in wals)
    finally:
        for wal in wals:
            await wal.close()


async def test_after_a_failed_syncfs_only_the_wal_whose_file_failed_fails(
    tmp_path: Path, shared_pool: WriterPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    wals = await open_wals(tmp_path, shared_pool, 6)
    counter = SyncCounter(monkeypatch, syncfs_error=5)
    bad = wals[3]
    counter.failing.add(bad.directory)
    try:
        appends = await queued_behind_one_turn(monkeypatch, wals)
        results = await asyncio.gather(*appends, return_exceptions=True)
        assert isinstance(results[3], StorageError)  # its producer hears it: never acknowledged
        assert [r for i, r in enumerate(results) if i != 3] == [0] * 5
        assert bad.failed is not None and bad.committed_offset == 0
        assert all(w.failed is None and w.committed_offset == 1 for w in wals if w is not bad)
        with pytest.raises(StorageError):
            await bad.append([b"y"])
    finally:
        for wal in wals:
            await wal.close()
    # what was acknowledged is on disk: reopened, every other WAL holds its record
    pool = WriterPool(1)
    try:
        for wal in wals:
            if wal is not bad:
                again = await Wal.open(wal.directory, WalConfig(), pool=pool)
                try:
                    assert await again.reader(0).read(timeout=1) == [(0, b"x")]
                finally:
                    await again.close()
    finally:
        assert pool.close(10)


async def test_without_a_permitted_syncfs_the_pool_goes_back_to_fdatasync(
    tmp_path: Path, shared_pool: WriterPool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    wals = await open_wals(tmp_path, shared_pool, 5)
    counter = SyncCounter(monkeypatch, syncfs_error=38)  # ENOSYS: a sandbox filtered the call out
    try:
        appends = await queued_behind_one_turn(monkeypatch, wals)
        assert await asyncio.gather(*appends) == [0] * 5
        assert not shared_pool.shared_sync
        assert "syncfs is not usable here" in caplog.text
        assert await asyncio.gather(*(w.append([b"again"]) for w in wals)) == [1] * 5
        assert counter.syncfs_calls == 1  # never tried again
        assert len(counter.fdatasyncs) == 10
    finally:
        for wal in wals:
            await wal.close()


def test_the_pool_size_follows_whether_syncfs_can_serve_a_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    from ister.storage.wal import durable

    pools = []
    if durable.syncfs is not None:
        pools.append(WriterPool(0))
        assert pools[-1].threads == 2 and pools[-1].shared_sync
    pools.append(WriterPool(0, shared_sync=False))
    assert pools[-1].threads == 8 and not pools[-1].shared_sync
    monkeypatch.setattr(durable, "syncfs", None)
    pools.append(WriterPool(0))
    assert pools[-1].threads == 8 and not pools[-1].shared_sync
    pools.append(WriterPool(3))
    assert pools[-1].threads == 3
    for pool in pools:
        assert pool.close(1)  # no WAL ever registered: no threads were started


# ---- several checkpoints with one syncfs (write_checkpoints) ------------------------------------------


class FailingSlotWrite(CheckpointFile):
    """A checkpoint file whose in-place slot writes fail with EIO (a simulated disk error)."""

    __slots__ = ("failing",)

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.failing = True

    def _overwrite(self, checkpoint: Checkpoint) -> int:
        if self.failing:
            raise OSError(errno.EIO, "simulated I/O error")
        return super()._overwrite(checkpoint)


def slot_offsets(directory: Path) -> list[int]:
    """The next_offset each slot of a two-slot checkpoint file holds."""
    data = (directory / CHECKPOINT_NAME).read_bytes()
    return [decode_slot(data[i * SLOT_SIZE : (i + 1) * SLOT_SIZE])[1].next_offset for i in (0, 1)]


def checkpoint_files(tmp_path: Path, n: int, first: int = 5) -> list[CheckpointFile]:
    """n WAL directories, each with a checkpoint file its CheckpointFile has written once (a new file)."""
    files = []
    for i in range(n):
        d = tmp_path / f"w{i}"
        d.mkdir()
        f = CheckpointFile(d)
        f.write(Checkpoint(first))
        files.append(f)
    return files


def test_write_checkpoints_overwrites_slots_with_one_syncfs_and_reports_the_one_it_could_not(
    tmp_path: Path,
) -> None:
    from ister.storage.wal import durable

    if durable.syncfs is None:
        pytest.skip("no usable syncfs(2) on this platform")
    files = checkpoint_files(tmp_path, 4, first=1)
    files[2] = FailingSlotWrite(files[2].directory)  # an EIO on its slot (simulated: a disk that fails)
    files[2].write(Checkpoint(1))
    calls: list[int] = []

    def syncfs(fd: int) -> None:
        calls.append(fd)
        durable.syncfs(fd)  # type: ignore[misc]

    results = write_checkpoints([(f, Checkpoint(10 + i, ((2, 3),))) for i, f in enumerate(files)], syncfs)
    assert [r is None for r in results] == [True, True, False, True]
    assert isinstance(results[2], OSError)
    assert len(calls) == 1  # no file was replaced: one syncfs for all four
    assert [read_checkpoint(f.directory) for f in files] == [
        Checkpoint(10, ((2, 3),)),
        Checkpoint(11, ((2, 3),)),
        Checkpoint(1),  # the previous one, untouched
        Checkpoint(13, ((2, 3),)),
    ]
    assert sorted(p.name for p in files[0].directory.iterdir()) == [CHECKPOINT_NAME]  # no tmp file
    # The next round goes to the other slot of each; the one that failed retries the same slot.
    files[2].failing = False  # type: ignore[attr-defined]
    assert write_checkpoints([(f, Checkpoint(20)) for f in files], syncfs) == [None] * 4
    assert [read_checkpoint(f.directory) for f in files] == [Checkpoint(20)] * 4
    assert [slot_offsets(f.directory) for f in files] == [[20, 10], [20, 11], [1, 20], [20, 13]]


def test_write_checkpoints_replaces_new_files_and_one_that_cannot_be_created_keeps_the_old(
    tmp_path: Path,
) -> None:
    from ister.storage.wal import durable

    if durable.syncfs is None:
        pytest.skip("no usable syncfs(2) on this platform")
    files = checkpoint_files(tmp_path, 3)
    files[1] = CheckpointFile(files[1].directory)  # knows nothing of the file: must replace it
    files[2] = CheckpointFile(files[2].directory)
    (files[2].directory / TMP_NAME).mkdir()  # its tmp file cannot be created: that one fails
    calls: list[int] = []

    def syncfs(fd: int) -> None:
        calls.append(fd)
        durable.syncfs(fd)  # type: ignore[misc]

    results = write_checkpoints([(f, Checkpoint(9)) for f in files], syncfs)
    assert results[0] is None and results[1] is None and isinstance(results[2], OSError)
    assert len(calls) == 2  # one for the slot and the tmp file, one for the rename
    assert [read_checkpoint(f.directory) for f in files] == [Checkpoint(9), Checkpoint(9), Checkpoint(5)]
    assert not (files[1].directory / TMP_NAME).exists()


def test_write_checkpoints_raises_when_syncfs_fails_and_keeps_the_previous_ones(tmp_path: Path) -> None:
    files = checkpoint_files(tmp_path, 3)
    files[2] = CheckpointFile(files[2].directory)  # this one goes through a tmp file and a rename

    def failing(fd: int) -> None:
        raise OSError(5, "simulated write-back error")

    with pytest.raises(OSError, match="write-back"):
        write_checkpoints([(f, Checkpoint(9)) for f in files], failing)
    # The slots were overwritten but not known durable: each file's newest durable slot is untouched and
    # is what the next write (the pool's one-by-one fallback) keeps.
    assert [read_checkpoint(f.directory) for f in files] == [Checkpoint(9), Checkpoint(9), Checkpoint(5)]
    for f in files:
        f.write(Checkpoint(10))
    assert [read_checkpoint(f.directory) for f in files] == [Checkpoint(10)] * 3
    # the retry went to the same slot: the other one still holds the last durable checkpoint, 5
    for f in files[:2]:
        assert sorted(slot_offsets(f.directory)) == [5, 10]


def test_write_checkpoints_reports_a_failed_rename_and_leaves_no_tmp_file(tmp_path: Path) -> None:
    files = [CheckpointFile(f.directory) for f in checkpoint_files(tmp_path, 3)]  # all replace
    target = files[1].directory / CHECKPOINT_NAME
    target.unlink()
    (target / "x").mkdir(parents=True)  # a non-empty directory: the rename over it fails
    results = write_checkpoints([(f, Checkpoint(9)) for f in files], lambda fd: None)
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], OSError)
    assert not (files[1].directory / TMP_NAME).exists()
    assert read_checkpoint(files[0].directory) == read_checkpoint(files[2].directory) == Checkpoint(9)


def test_write_checkpoints_raises_when_the_second_syncfs_fails(tmp_path: Path) -> None:
    files = [CheckpointFile(f.directory) for f in checkpoint_files(tmp_path, 2)]
    calls: list[int] = []

    def second_fails(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 2:
            raise OSError(5, "simulated write-back error")

    # The renames are done but not known durable: the caller (the pool) writes each again the usual way,
    # which replaces the file once more (the writer knows nothing durable of the new one).
    with pytest.raises(OSError, match="write-back"):
        write_checkpoints([(f, Checkpoint(9)) for f in files], second_fails)
    assert len(calls) == 2
    for f in files:
        assert f.stage(Checkpoint(10)) is None  # must be replaced, not written in place


async def test_checkpoints_due_together_are_written_with_two_syncfs(
    tmp_path: Path, shared_pool: WriterPool, monkeypatch: pytest.MonkeyPatch
) -> None:

    wals = await open_wals(tmp_path, shared_pool, 12)
    counter = SyncCounter(monkeypatch)
    try:
        appends = await queued_behind_one_turn(monkeypatch, wals)
        assert await asyncio.gather(*appends) == [0] * 12
        await checkpoints_recorded(wals, 1)  # written after the appends completed
        # the batch of 11 wrote its records with one syncfs and its due checkpoints with two more: each
        # writer's first checkpoint makes a new file (tmp files, syncfs, renames, syncfs)
        assert counter.syncfs_calls == 3
        # From then on each overwrites a slot of its file in place: one syncfs for all the checkpoints.
        monkeypatch.setattr("ister.storage.wal.highwater.CHECKPOINT_INTERVAL_S", 0.0)
        counter.syncfs_calls = 0
        appends = await queued_behind_one_turn(monkeypatch, wals)
        assert await asyncio.gather(*appends) == [1] * 12
        await checkpoints_recorded(wals, 2)
        assert counter.syncfs_calls == 2  # the records', the checkpoints'
        assert all(slot_offsets(w.directory) == [1, 2] for w in wals[1:])
    finally:
        for wal in wals:
            await wal.close()


async def test_when_the_checkpoints_syncfs_fails_each_is_written_on_its_own(
    tmp_path: Path, shared_pool: WriterPool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from ister.storage.wal import durable

    wals = await open_wals(tmp_path, shared_pool, 6)
    real = durable.syncfs
    assert real is not None
    calls = 0

    def second_call_fails(fd: int) -> None:  # the records' syncfs works, the checkpoints' does not
        nonlocal calls
        calls += 1
        if calls == 2:
            raise OSError(5, "simulated write-back error")
        real(fd)

    monkeypatch.setattr(durable, "syncfs", second_call_fails)
    try:
        appends = await queued_behind_one_turn(monkeypatch, wals)
        assert await asyncio.gather(*appends) == [0] * 6
        await checkpoints_recorded(wals, 1)  # each written on its own
        assert "checkpoints written one by one" in caplog.text
        assert calls == 2  # the records' syncfs, the checkpoints' failed one: then fsyncs per file
        assert all(w.failed is None for w in wals)
    finally:
        for wal in wals:
            await wal.close()


async def test_an_unexpected_error_writing_checkpoints_together_keeps_the_pool_running(
    tmp_path: Path, shared_pool: WriterPool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from ister.storage.wal import pool as pool_module

    def broken(*args: object) -> list[OSError | None]:
        raise RuntimeError("a bug in the batched path")

    monkeypatch.setattr(pool_module, "write_checkpoints", broken)
    wals = await open_wals(tmp_path, shared_pool, 5)
    try:
        appends = await queued_behind_one_turn(monkeypatch, wals)
        assert await asyncio.gather(*appends) == [0] * 5
        await checkpoints_recorded(wals, 1)  # each written on its own instead
        assert "writing checkpoints together failed" in caplog.text
        assert await asyncio.gather(*(w.append([b"next"]) for w in wals)) == [1] * 5  # the thread lives on
    finally:
        for wal in wals:
            await wal.close()
