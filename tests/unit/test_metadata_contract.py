"""The MetadataStore contract, run against every backend; then embedded-only durability and the LocalCache.

Contract tests use only the protocol (plus `Backend.reopen` where a backend is persistent), so a new backend
is covered by adding one branch to the `backend` fixture.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ister.errors import InvalidArgument, MetadataError, WatchLagged
from ister.metadata import store as store_module
from ister.metadata.cache import LocalCache
from ister.metadata.embedded import DB_FILE, EmbeddedStore
from ister.metadata.store import (
    KeyValue,
    LeaseNotFound,
    ListTooLarge,
    MetadataStore,
    Watch,
    WatchEvent,
)

WAIT = 5.0  # upper bound for anything we wait on; tests normally finish far sooner


@dataclass
class Backend:
    name: str
    store: MetadataStore
    short_ttl: float  # a lease TTL short enough to wait out in a unit test
    reopen: Callable[[], Awaitable[MetadataStore]] | None = None  # persistent backends: close and open again


@pytest.fixture(params=["embedded", "memory"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    if request.param == "embedded":
        b = Backend("embedded", await EmbeddedStore.open(tmp_path / "meta"), short_ttl=0.2)

        async def reopen() -> MetadataStore:
            await b.store.close()
            b.store = await EmbeddedStore.open(tmp_path / "meta")
            return b.store

        b.reopen = reopen
    else:
        b = Backend("memory", EmbeddedStore.in_memory(), short_ttl=0.2)
    try:
        yield b
    finally:
        await b.store.close()


@pytest.fixture
def store(backend: Backend) -> MetadataStore:
    return backend.store


async def next_event(watch: Watch) -> WatchEvent:
    async with asyncio.timeout(WAIT):
        return await anext(watch)


async def events(watch: Watch, count: int) -> list[WatchEvent]:
    return [await next_event(watch) for _ in range(count)]


async def run_python(script: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        async with asyncio.timeout(30):
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


# --- basic key/value ------------------------------------------------------------------------------


async def test_get_put_delete(store: MetadataStore) -> None:
    assert await store.get("/a") is None
    rev = await store.put("/a", {"x": 1})
    assert rev > 0
    assert await store.get("/a") == KeyValue("/a", {"x": 1}, rev)
    rev2 = await store.put("/a", [1, "two", None, True, 1.5])
    assert rev2 > rev
    assert await store.get("/a") == KeyValue("/a", [1, "two", None, True, 1.5], rev2)
    assert await store.delete("/a") is True
    assert await store.get("/a") is None
    assert await store.delete("/a") is False


async def test_null_and_scalar_values(store: MetadataStore) -> None:
    await store.put("/null", None)
    await store.put("/zero", 0)
    await store.put("/str", "Reliable")
    null = await store.get("/null")
    assert null is not None and null.value is None
    assert [kv.value for kv in await store.list("/")] == [None, "Reliable", 0]


async def test_revisions_strictly_increase(store: MetadataStore) -> None:
    revs = [await store.put(f"/k/{i}", i) for i in range(5)]
    revs.append(await store.put("/k/0", "again"))
    assert revs == sorted(set(revs))
    assert (await store.get("/k/1")) == KeyValue("/k/1", 1, revs[1])


async def test_returned_values_are_copies(store: MetadataStore) -> None:
    value = {"list": [1, 2]}
    await store.put("/copy", value)
    value["list"].append(3)
    got = await store.get("/copy")
    assert got is not None and got.value == {"list": [1, 2]}
    got.value["list"].append(4)
    again = await store.get("/copy")
    assert again is not None and again.value == {"list": [1, 2]}


async def test_big_u64_values_round_trip(store: MetadataStore) -> None:
    u64 = 2**64 - 1
    value = {"broker_id": u64, "ids": [u64, 2**63, -(2**63)], "nested": {"n": 18446744073709551557}}
    rev = await store.put("/big", value)
    got = await store.get("/big")
    assert got == KeyValue("/big", value, rev)
    assert got is not None and type(got.value["broker_id"]) is int
    await store.put("/leader", u64)
    leader = await store.get("/leader")
    assert leader is not None and leader.value == u64 and type(leader.value) is int


# --- listing --------------------------------------------------------------------------------------


async def test_list_sorted_with_versions(store: MetadataStore) -> None:
    revs = {}
    for key in ["/l/c", "/l/a", "/l/b/x", "/l/b", "/m/a"]:
        revs[key] = await store.put(key, key)
    listed = await store.list("/l/")
    assert [kv.key for kv in listed] == ["/l/a", "/l/b", "/l/b/x", "/l/c"]
    assert all(kv.value == kv.key and kv.version == revs[kv.key] for kv in listed)
    assert await store.list("/nothing/") == []


async def test_prefix_isolation(store: MetadataStore) -> None:
    for key in ["/a/b", "/a/bc", "/a/b/c", "/a/b/d/e"]:
        await store.put(key, None)
    assert [kv.key for kv in await store.list("/a/b/")] == ["/a/b/c", "/a/b/d/e"]
    assert [kv.key for kv in await store.list("/a/b")] == ["/a/b", "/a/b/c", "/a/b/d/e", "/a/bc"]
    assert await store.delete_prefix("/a/b/") == 2
    assert [kv.key for kv in await store.list("/a/")] == ["/a/b", "/a/bc"]
    assert await store.delete_prefix("/a/b/") == 0
    assert await store.delete_prefix("/a/") == 2
    assert await store.list("/") == []


async def test_list_limit_and_paging(store: MetadataStore) -> None:
    for i in range(7):
        await store.put(f"/p/{i}", i)
    first = await store.list("/p/", limit=3)
    assert [kv.value for kv in first] == [0, 1, 2]
    second = await store.list("/p/", limit=3, start_after=first[-1].key)
    assert [kv.value for kv in second] == [3, 4, 5]
    third = await store.list("/p/", limit=3, start_after=second[-1].key)
    assert [kv.value for kv in third] == [6]
    assert await store.list("/p/", start_after="/p/6") == []


async def test_list_bound(store: MetadataStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "MAX_LIST_RESULTS", 4)
    for i in range(5):
        await store.put(f"/bound/{i}", i)
    with pytest.raises(ListTooLarge):
        await store.list("/bound/")
    assert len(await store.list("/bound/", limit=5)) == 5
    assert len(await store.list("/bound/", start_after="/bound/0")) == 4


# --- compare and set / delete ---------------------------------------------------------------------


async def test_compare_and_set(store: MetadataStore) -> None:
    assert await store.compare_and_set("/cas", "one", expected_version=None) is True
    first = await store.get("/cas")
    assert first is not None and first.value == "one"
    assert await store.compare_and_set("/cas", "two", expected_version=None) is False
    assert await store.compare_and_set("/cas", "two", expected_version=first.version + 1000) is False
    assert await store.compare_and_set("/cas", "two", expected_version=first.version) is True
    second = await store.get("/cas")
    assert second is not None and second.value == "two" and second.version > first.version
    assert await store.compare_and_set("/cas", "three", expected_version=first.version) is False
    assert await store.compare_and_set("/missing", 1, expected_version=first.version) is False
    assert await store.get("/missing") is None


async def test_compare_and_set_races_have_one_winner(store: MetadataStore) -> None:
    results = await asyncio.gather(
        *(store.compare_and_set("/owner", i, expected_version=None) for i in range(10))
    )
    assert results.count(True) == 1


async def test_compare_and_delete(store: MetadataStore) -> None:
    rev = await store.put("/cad", 1)
    assert await store.compare_and_delete("/cad", expected_version=rev + 1) is False
    assert await store.get("/cad") is not None
    assert await store.compare_and_delete("/cad", expected_version=rev) is True
    assert await store.get("/cad") is None
    assert await store.compare_and_delete("/cad", expected_version=rev) is False


# --- watches --------------------------------------------------------------------------------------


async def test_watch_put_and_delete_in_order(store: MetadataStore) -> None:
    await store.put("/w/before", 0)
    watch = store.watch("/w/")
    try:
        r1 = await store.put("/w/a", 1)
        await store.put("/other", 9)
        await store.put("/wx", 9)
        r2 = await store.put("/w/b", {"v": 2})
        await store.delete("/w/missing")
        r3 = await store.put("/w/a", 3)
        assert await store.delete("/w/a")
        got = await events(watch, 4)
        assert [(e.kind, e.key, e.value) for e in got] == [
            ("put", "/w/a", 1),
            ("put", "/w/b", {"v": 2}),
            ("put", "/w/a", 3),
            ("delete", "/w/a", None),
        ]
        assert [e.revision for e in got[:3]] == [r1, r2, r3]
        assert got[3].revision > r3
    finally:
        watch.close()


async def test_watch_delete_prefix_and_cas(store: MetadataStore) -> None:
    async with store.watch("/d/") as watch:
        await store.put("/d/1", 1)
        await store.put("/d/2", 2)
        assert await store.compare_and_set("/d/3", 3, expected_version=None)
        assert await store.compare_and_set("/d/3", 3, expected_version=None) is False
        assert await store.delete_prefix("/d/") == 3
        got = await events(watch, 6)
    assert [(e.kind, e.key) for e in got] == [
        ("put", "/d/1"),
        ("put", "/d/2"),
        ("put", "/d/3"),
        ("delete", "/d/1"),
        ("delete", "/d/2"),
        ("delete", "/d/3"),
    ]
    revisions = [e.revision for e in got]
    assert revisions == sorted(revisions)


async def test_watch_close_ends_iteration(store: MetadataStore) -> None:
    watch = store.watch("/c/")

    async def drain() -> list[WatchEvent]:
        return [event async for event in watch]

    task = asyncio.create_task(drain())
    await store.put("/c/1", 1)
    await asyncio.sleep(0)
    watch.close()
    async with asyncio.timeout(WAIT):
        received = await task
    assert [e.key for e in received] in ([], ["/c/1"])


async def test_watch_lag_raises(store: MetadataStore) -> None:
    watch = store.watch("/lag/", max_queue=4)
    try:
        for i in range(20):
            await store.put(f"/lag/{i}", i)
        received = 0
        with pytest.raises(WatchLagged):
            async with asyncio.timeout(WAIT):
                async for _ in watch:
                    received += 1
        assert received < 20
    finally:
        watch.close()


async def test_watch_queue_within_bound_does_not_lag(store: MetadataStore) -> None:
    async with store.watch("/ok/", max_queue=8) as watch:
        for i in range(8):
            await store.put(f"/ok/{i}", i)
        assert [e.value for e in await events(watch, 8)] == list(range(8))


# --- leases ---------------------------------------------------------------------------------------


async def test_lease_expiry_deletes_keys(backend: Backend) -> None:
    store = backend.store
    lease = await store.grant_lease(backend.short_ttl)
    async with store.watch("/lease/") as watch:
        await store.put("/lease/a", "a", lease=lease)
        assert await store.compare_and_set("/lease/b", "b", expected_version=None, lease=lease)
        await store.put("/lease/plain", "p")
        got = await events(watch, 5)
    assert [(e.kind, e.key) for e in got[:3]] == [
        ("put", "/lease/a"),
        ("put", "/lease/b"),
        ("put", "/lease/plain"),
    ]
    assert sorted((e.kind, e.key) for e in got[3:]) == [("delete", "/lease/a"), ("delete", "/lease/b")]
    assert [kv.key for kv in await store.list("/lease/")] == ["/lease/plain"]
    with pytest.raises(LeaseNotFound):
        await store.keep_alive(lease)
    with pytest.raises(LeaseNotFound):
        await store.put("/lease/late", 1, lease=lease)
    assert await store.get("/lease/late") is None


async def test_keep_alive_extends(backend: Backend) -> None:
    store, ttl = backend.store, backend.short_ttl
    lease = await store.grant_lease(ttl)
    await store.put("/ka/k", 1, lease=lease)
    loop = asyncio.get_running_loop()
    until = loop.time() + 4 * ttl
    while loop.time() < until:
        await store.keep_alive(lease)
        await asyncio.sleep(ttl / 4)
    assert await store.get("/ka/k") is not None  # survived four TTLs thanks to keep-alives
    async with store.watch("/ka/") as watch:
        event = await next_event(watch)  # stop renewing: it expires
    assert (event.kind, event.key) == ("delete", "/ka/k")


async def test_revoke_deletes_keys(store: MetadataStore) -> None:
    lease = await store.grant_lease(60)
    await store.put("/rv/a", 1, lease=lease)
    await store.put("/rv/b", 2, lease=lease)
    await store.put("/rv/detached", 3, lease=lease)
    await store.put("/rv/detached", 4)  # a put without a lease detaches the key
    async with store.watch("/rv/") as watch:
        await store.revoke_lease(lease)
        got = await events(watch, 2)
    assert sorted((e.kind, e.key) for e in got) == [("delete", "/rv/a"), ("delete", "/rv/b")]
    assert [kv.key for kv in await store.list("/rv/")] == ["/rv/detached"]
    with pytest.raises(LeaseNotFound):
        await store.keep_alive(lease)
    await store.revoke_lease(lease)  # revoking again is a no-op


async def test_unknown_lease_rejected(store: MetadataStore) -> None:
    with pytest.raises(LeaseNotFound):
        await store.put("/x", 1, lease=12345)
    with pytest.raises(LeaseNotFound):
        await store.compare_and_set("/x", 1, expected_version=None, lease=12345)
    with pytest.raises(LeaseNotFound):
        await store.keep_alive(12345)
    assert await store.get("/x") is None


@pytest.mark.parametrize("ttl", [0, -1, float("nan")])
async def test_invalid_ttl(store: MetadataStore, ttl: float) -> None:
    with pytest.raises(InvalidArgument):
        await store.grant_lease(ttl)


# --- validation -----------------------------------------------------------------------------------

BAD_KEYS: list[Any] = ["", "a/b", "relative", 42, None, b"/bytes", "/nul\x00key", "/" + "x" * 5000]


@pytest.mark.parametrize("key", BAD_KEYS)
async def test_invalid_keys_rejected(store: MetadataStore, key: Any) -> None:
    with pytest.raises(InvalidArgument):
        await store.get(key)
    with pytest.raises(InvalidArgument):
        await store.put(key, 1)
    with pytest.raises(InvalidArgument):
        await store.delete(key)
    with pytest.raises(InvalidArgument):
        await store.delete_prefix(key)
    with pytest.raises(InvalidArgument):
        await store.list(key)
    with pytest.raises(InvalidArgument):
        await store.compare_and_set(key, 1, expected_version=None)
    with pytest.raises(InvalidArgument):
        await store.compare_and_delete(key, expected_version=1)
    with pytest.raises(InvalidArgument):
        store.watch(key)
    assert await store.list("/") == []


async def test_invalid_values_rejected(store: MetadataStore) -> None:
    with pytest.raises(InvalidArgument):
        await store.put("/v", object())
    with pytest.raises(InvalidArgument):
        await store.put("/v", "x" * (store_module.MAX_VALUE_BYTES + 1))
    assert await store.get("/v") is None


async def test_invalid_arguments_rejected(store: MetadataStore) -> None:
    with pytest.raises(InvalidArgument):
        await store.list("/", limit=0)
    with pytest.raises(InvalidArgument):
        store.watch("/", max_queue=0)


# --- persistence ----------------------------------------------------------------------------------


async def test_persistence_across_reopen(backend: Backend) -> None:
    if backend.reopen is None:
        pytest.skip(f"{backend.name} is not persistent")
    store = backend.store
    rev_a = await store.put("/keep/a", {"id": 2**64 - 1})
    rev_b = await store.put("/keep/b", "b")
    await store.put("/keep/gone", 1)
    last = await store.delete("/keep/gone")
    assert last
    store = await backend.reopen()
    assert await store.list("/keep/") == [
        KeyValue("/keep/a", {"id": 2**64 - 1}, rev_a),
        KeyValue("/keep/b", "b", rev_b),
    ]
    assert await store.put("/keep/c", 3) > rev_b + 1  # the delete had its own revision


# --- embedded-only: durability, leases across restarts, the directory lock ------------------------


async def test_embedded_leased_keys_gone_after_reopen(tmp_path: Path) -> None:
    store = await EmbeddedStore.open(tmp_path)
    lease = await store.grant_lease(60)
    await store.put("/r/leased", 1, lease=lease)
    before = await store.put("/r/plain", 2)
    await store.close()
    store = await EmbeddedStore.open(tmp_path)
    try:
        assert [kv.key for kv in await store.list("/r/")] == ["/r/plain"]
        with pytest.raises(LeaseNotFound):
            await store.keep_alive(lease)
        assert await store.put("/r/next", 3) > before
    finally:
        await store.close()


async def test_embedded_survives_kill(tmp_path: Path) -> None:
    """A process that dies without closing (os._exit, like kill -9) loses nothing it was told was written."""
    script = textwrap.dedent(
        f"""
        import asyncio, os
        from pathlib import Path
        from ister.metadata.embedded import EmbeddedStore

        async def main():
            store = await EmbeddedStore.open(Path({str(tmp_path)!r}))
            lease = await store.grant_lease(60)
            await store.put("/k/leased", 1, lease=lease)
            rev = await store.put("/k/durable", {{"offset": 18446744073709551615}})
            print(rev, flush=True)
            os._exit(0)

        asyncio.run(main())
        """
    )
    returncode, out, err = await run_python(script)
    assert returncode == 0, err
    rev = int(out.strip())
    store = await EmbeddedStore.open(tmp_path)
    try:
        assert await store.list("/k/") == [KeyValue("/k/durable", {"offset": 2**64 - 1}, rev)]
        assert await store.put("/k/after", 1) > rev
    finally:
        await store.close()


async def test_embedded_second_open_fails_clearly(tmp_path: Path) -> None:
    first = await EmbeddedStore.open(tmp_path)
    try:
        with pytest.raises(MetadataError, match="already in use"):
            await EmbeddedStore.open(tmp_path)
        await first.put("/still", "works")
    finally:
        await first.close()
    again = await EmbeddedStore.open(tmp_path)
    try:
        assert await again.get("/still") is not None
    finally:
        await again.close()


async def test_embedded_second_process_refused(tmp_path: Path) -> None:
    first = await EmbeddedStore.open(tmp_path)
    script = textwrap.dedent(
        f"""
        import asyncio
        from pathlib import Path
        from ister.errors import MetadataError
        from ister.metadata.embedded import EmbeddedStore

        async def main():
            try:
                await EmbeddedStore.open(Path({str(tmp_path)!r}))
            except MetadataError as exc:
                print(exc)

        asyncio.run(main())
        """
    )
    try:
        _, out, err = await run_python(script)
    finally:
        await first.close()
    assert "already in use" in out, err


async def test_embedded_files_and_closed_store(tmp_path: Path) -> None:
    store = await EmbeddedStore.open(tmp_path / "nested" / "dir")
    assert (tmp_path / "nested" / "dir" / DB_FILE).exists()
    watch = store.watch("/")
    await store.close()
    async with asyncio.timeout(WAIT):
        assert [e async for e in watch] == []
    with pytest.raises(MetadataError):
        await store.get("/a")
    await store.close()  # idempotent


async def test_embedded_failed_write_changes_nothing(tmp_path: Path) -> None:
    store = await EmbeddedStore.open(tmp_path)
    try:
        rev = await store.put("/a", 1)
        store._db._conn.close()  # type: ignore[union-attr]  # simulate a failing disk
        with pytest.raises(MetadataError):
            await store.put("/a", 2)
        with pytest.raises(MetadataError):
            await store.delete("/a")
        assert await store.get("/a") == KeyValue("/a", 1, rev)
        assert store.revision == rev
    finally:
        await store.close()


# --- LocalCache -----------------------------------------------------------------------------------


async def test_cache_mirrors_prefixes(store: MetadataStore) -> None:
    await store.put("/c1/a", 1)
    await store.put("/c2/b", 2)
    await store.put("/outside", 0)
    cache = LocalCache(store, ["/c1/", "/c2/"])
    await cache.start()
    try:
        assert cache.ready
        a = cache.get("/c1/a")
        assert a is not None and a.value == 1
        assert cache.get("/outside") is None
        rev = await store.put("/c1/c", 3)
        await store.delete("/c2/b")
        await store.put("/outside", 1)
        assert await cache.wait_for(lambda: cache.get("/c2/b") is None, WAIT)
        assert cache.list("/c1/") == [KeyValue("/c1/a", 1, a.version), KeyValue("/c1/c", 3, rev)]
        assert cache.list("/c2/") == []
        assert cache.get("/outside") is None
    finally:
        await cache.close()


async def test_cache_recovers_from_lag(store: MetadataStore) -> None:
    cache = LocalCache(store, ["/lagc/"], max_queue=2)
    await cache.start()
    try:
        for i in range(50):
            await store.put(f"/lagc/{i:02d}", i)
        await store.delete("/lagc/00")
        assert await cache.wait_for(lambda: len(cache.list("/lagc/")) == 49, WAIT)
        assert [kv.value for kv in cache.list("/lagc/")] == list(range(1, 50))
    finally:
        await cache.close()


async def test_cache_sees_lease_expiry(backend: Backend) -> None:
    store = backend.store
    cache = LocalCache(store, ["/lc/"])
    await cache.start()
    try:
        lease = await store.grant_lease(backend.short_ttl)
        await store.put("/lc/k", 1, lease=lease)
        assert await cache.wait_for(lambda: cache.get("/lc/k") is not None, WAIT)
        assert await cache.wait_for(lambda: cache.get("/lc/k") is None, WAIT)
    finally:
        await cache.close()


def test_cache_rejects_overlapping_prefixes() -> None:
    store = EmbeddedStore.in_memory()
    with pytest.raises(InvalidArgument):
        LocalCache(store, ["/a/", "/a/b/"])
    with pytest.raises(InvalidArgument):
        LocalCache(store, [])
    with pytest.raises(InvalidArgument):
        LocalCache(store, ["relative"])
