"""The MetadataStore contract, run against every backend; then backend-only tests and the LocalCache.

Contract tests use only the protocol (plus `Backend.reopen` where a backend is persistent), so a new backend
is covered by adding one branch to the `backend` fixture. The etcd backend runs on a real etcd (the session
`etcd_server` fixture), each test in its own key namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aetcd import rpc

from ister.errors import InvalidArgument, MetadataError, WatchLagged
from ister.metadata import store as store_module
from ister.metadata.cache import LocalCache
from ister.metadata.embedded import EmbeddedStore
from ister.metadata.embedded_files import DB_FILE, SqliteCopy
from ister.metadata.etcd import EtcdStore
from ister.metadata.store import (
    MAX_TXN_OPS,
    Compare,
    Delete,
    KeyValue,
    LeaseNotFound,
    ListTooLarge,
    MetadataStore,
    Put,
    Watch,
    WatchEvent,
)
from tests.etcd_server import EtcdServer, etcd_binary
from tests.support import free_port

WAIT = 5.0  # upper bound for anything we wait on; tests normally finish far sooner
ETCD_MIN_TTL = 2.0  # etcd raises shorter lease TTLs to ceil(1.5 x election timeout) = 2 s by default


@dataclass
class Backend:
    name: str
    store: MetadataStore
    short_ttl: float  # a lease TTL short enough to wait out in a unit test
    reopen: Callable[[], Awaitable[MetadataStore]] | None = None  # persistent backends: close and open again


def unique_namespace() -> str:
    return "/t-" + uuid.uuid4().hex


@pytest.fixture(params=["embedded", "memory", "etcd"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    if request.param == "embedded":
        b = Backend("embedded", await EmbeddedStore.open(tmp_path / "meta"), short_ttl=0.2)

        async def reopen() -> MetadataStore:
            await b.store.close()
            b.store = await EmbeddedStore.open(tmp_path / "meta")
            return b.store

        b.reopen = reopen
    elif request.param == "etcd":
        server: EtcdServer = request.getfixturevalue("etcd_server")
        namespace = unique_namespace()
        b = Backend("etcd", await EtcdStore.connect([server.endpoint], namespace=namespace), ETCD_MIN_TTL)

        async def reopen_etcd() -> MetadataStore:
            await b.store.close()
            b.store = await EtcdStore.connect([server.endpoint], namespace=namespace)
            return b.store

        b.reopen = reopen_etcd
    else:
        b = Backend("memory", EmbeddedStore.in_memory(), short_ttl=0.2)
    try:
        yield b
    finally:
        if b.name == "etcd":  # the session etcd outlives the test: drop the test's keys
            with contextlib.suppress(MetadataError):
                await b.store.delete_prefix("/")
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


# --- transactions ---------------------------------------------------------------------------------


async def test_txn_applies_all_ops_in_one_revision(store: MetadataStore) -> None:
    old = await store.put("/tx/old", "old")
    keep = await store.put("/tx/keep", "keep")
    ops = [Put("/tx/a", {"a": 1}), Delete("/tx/old"), Put("/tx/b", [2]), Put("/tx/keep", "new")]
    assert await store.txn([Compare("/tx/old", old), Compare("/tx/new", None)], ops) is True
    listed = await store.list("/tx/")
    assert [(kv.key, kv.value) for kv in listed] == [("/tx/a", {"a": 1}), ("/tx/b", [2]), ("/tx/keep", "new")]
    revisions = {kv.version for kv in listed}
    assert len(revisions) == 1 and revisions.pop() > keep  # one new revision for the whole txn
    assert await store.txn([], [Put("/tx/c", 3)]) is True  # no compares: unconditional


async def test_txn_compares_absent_and_version(store: MetadataStore) -> None:
    assert await store.txn([Compare("/tc/k", None)], [Put("/tc/k", 1)]) is True
    first = await store.get("/tc/k")
    assert first is not None
    assert await store.txn([Compare("/tc/k", None)], [Put("/tc/k", 2)]) is False  # present now
    assert await store.txn([Compare("/tc/k", first.version + 1000)], [Put("/tc/k", 2)]) is False
    assert await store.txn([Compare("/tc/k", first.version)], [Put("/tc/k", 2)]) is True
    second = await store.get("/tc/k")
    assert second is not None and second.value == 2 and second.version > first.version
    assert await store.txn([Compare("/tc/k", first.version)], [Delete("/tc/k")]) is False  # stale
    assert await store.txn([Compare("/tc/k", second.version)], [Delete("/tc/k")]) is True
    assert await store.get("/tc/k") is None
    assert await store.txn([Compare("/tc/k", second.version)], [Put("/tc/k", 3)]) is False  # gone
    assert await store.txn([Compare("/tc/missing", 1)], []) is False


async def test_txn_failed_compare_changes_nothing(store: MetadataStore) -> None:
    a = await store.put("/tf/a", "a")
    b = await store.put("/tf/b", "b")
    async with store.watch("/tf/") as watch:
        ops = [Put("/tf/a", "new"), Delete("/tf/b"), Put("/tf/c", "c")]
        # The first compare holds, the second does not: nothing of the txn may happen.
        assert await store.txn([Compare("/tf/a", a), Compare("/tf/b", a)], ops) is False
        assert await store.txn([Compare("/tf/a", a), Compare("/tf/c", b)], ops) is False
        marker = await store.put("/tf/marker", 1)
        event = await next_event(watch)  # the txns made no events: the marker comes first
    assert (event.key, event.revision) == ("/tf/marker", marker)
    assert await store.list("/tf/") == [
        KeyValue("/tf/a", "a", a),
        KeyValue("/tf/b", "b", b),
        KeyValue("/tf/marker", 1, marker),
    ]


async def test_txn_watchers_see_each_op(store: MetadataStore) -> None:
    await store.put("/tw/gone", 0)
    async with store.watch("/tw/") as watch:
        ops = [
            Put("/tw/x", 1),
            Delete("/tw/gone"),
            Delete("/tw/never"),
            Put("/tw/y", {"y": 2}),
            Put("/tz", 9),
        ]
        assert await store.txn([], ops) is True
        got = await events(watch, 3)
        marker = await store.put("/tw/marker", 1)
        assert (await next_event(watch)).revision == marker  # no event for the absent key or outside
    assert sorted((e.kind, e.key, e.value) for e in got) == [
        ("delete", "/tw/gone", None),
        ("put", "/tw/x", 1),
        ("put", "/tw/y", {"y": 2}),
    ]
    assert len({e.revision for e in got}) == 1
    x = await store.get("/tw/x")
    assert x is not None and x.version == got[0].revision


async def test_txn_with_lease(backend: Backend) -> None:
    store = backend.store
    lease = await store.grant_lease(60)
    assert await store.txn([Compare("/tl/a", None)], [Put("/tl/a", 1, lease=lease), Put("/tl/b", 2)])
    async with store.watch("/tl/") as watch:
        await store.revoke_lease(lease)
        event = await next_event(watch)
    assert (event.kind, event.key) == ("delete", "/tl/a")
    assert [kv.key for kv in await store.list("/tl/")] == ["/tl/b"]


async def test_txn_dead_lease_refused(store: MetadataStore) -> None:
    lease = await store.grant_lease(60)
    await store.revoke_lease(lease)
    for dead in (lease, 12345):
        with pytest.raises(LeaseNotFound):
            await store.txn([Compare("/td/a", None)], [Put("/td/a", 1), Put("/td/b", 2, lease=dead)])
    assert await store.list("/td/") == []


BAD_TXNS: list[tuple[str, list[Any], list[Any]]] = [
    ("duplicate key", [], [Put("/tb/a", 1), Delete("/tb/a")]),
    ("duplicate put", [], [Put("/tb/a", 1), Put("/tb/a", 2)]),
    ("too many ops", [], [Put(f"/tb/{i}", i) for i in range(MAX_TXN_OPS + 1)]),
    ("too many compares", [Compare(f"/tb/{i}", None) for i in range(MAX_TXN_OPS + 1)], [Put("/tb/a", 1)]),
    ("bad op key", [], [Put("/tb/a", 1), Put("relative", 2)]),
    ("bad delete key", [], [Put("/tb/a", 1), Delete("/nul\x00")]),
    ("bad value", [], [Put("/tb/a", 1), Put("/tb/b", object())]),
    ("oversize value", [], [Put("/tb/a", 1), Put("/tb/b", "x" * (store_module.MAX_VALUE_BYTES + 1))]),
    ("bad lease", [], [Put("/tb/a", 1), Put("/tb/b", 2, lease="1")]),  # type: ignore[arg-type]
    ("not an op", [], [Put("/tb/a", 1), ("/tb/b", 2)]),
    ("bad compare key", [Compare("x", None)], [Put("/tb/a", 1)]),
    ("zero version", [Compare("/tb/a", 0)], [Put("/tb/a", 1)]),
    ("bool version", [Compare("/tb/a", True)], [Put("/tb/a", 1)]),  # type: ignore[arg-type]
    ("not a compare", [("/tb/a", None)], [Put("/tb/a", 1)]),
]


@pytest.mark.parametrize(("why", "compares", "ops"), BAD_TXNS, ids=[t[0] for t in BAD_TXNS])
async def test_txn_bad_input_changes_nothing(
    store: MetadataStore, why: str, compares: list[Any], ops: list[Any]
) -> None:
    with pytest.raises(InvalidArgument):
        await store.txn(compares, ops)
    assert await store.list("/") == []


async def test_txn_max_ops_allowed(store: MetadataStore) -> None:
    ops = [Put(f"/tm/{i:03d}", i) for i in range(MAX_TXN_OPS)]
    compares = [Compare(f"/tm/{i:03d}", None) for i in range(MAX_TXN_OPS)]
    assert await store.txn(compares, ops) is True
    assert len(await store.list("/tm/")) == MAX_TXN_OPS


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
    until = loop.time() + 2 * ttl  # twice its TTL: without the keep-alives it would be gone by then
    while loop.time() < until:
        await store.keep_alive(lease)
        await asyncio.sleep(ttl / 4)
    assert await store.get("/ka/k") is not None  # survived two TTLs thanks to keep-alives
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


async def test_embedded_commits_run_off_the_loop_and_share_transactions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slow commit (a busy disk) does not stop the event loop: reads answer meanwhile, and the writes
    called meanwhile wait and then share a transaction, in call order."""
    store = await EmbeddedStore.open(tmp_path)
    gate = threading.Event()
    groups: list[int] = []
    real = SqliteCopy.commit

    def slow_commit(self: SqliteCopy, group: list[Any]) -> None:
        groups.append(len(group))
        assert gate.wait(10)
        real(self, group)

    monkeypatch.setattr(SqliteCopy, "commit", slow_commit)
    gate.set()
    try:
        await store.put("/a", 0)
        base = store.revision
        gate.clear()
        first = asyncio.ensure_future(store.put("/a", 1))
        deadline = time.monotonic() + 10
        while len(groups) < 2:  # the commit thread is inside the slow commit
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        assert await store.get("/a") == KeyValue("/a", 0, base)  # committed state only, loop not blocked
        rest = [asyncio.ensure_future(store.put(f"/k/{i}", i)) for i in range(50)]
        cas = asyncio.ensure_future(store.compare_and_set("/a", 2, expected_version=base + 1))
        stale = asyncio.ensure_future(store.compare_and_set("/a", 3, expected_version=base))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not any(f.done() for f in [first, *rest, cas, stale])  # nothing returns before its commit
        gate.set()
        assert await asyncio.gather(first, *rest) == list(range(base + 1, base + 52))
        assert await cas is True  # it waited for the put on /a, then compared with its revision
        assert await stale is False
        assert groups[:2] == [1, 1] and sum(groups[2:]) == 51 and len(groups) <= 4
    finally:
        gate.set()
        await store.close()
    reopened = await EmbeddedStore.open(tmp_path)
    try:
        assert (await reopened.get("/a")).value == 2  # type: ignore[union-attr]
        assert len(await reopened.list("/k/")) == 50
    finally:
        await reopened.close()


# --- etcd-only: namespaces, endpoints, restarts, lease minimum -------------------------------------


@pytest.fixture
async def etcd_pair(etcd_server: EtcdServer) -> AsyncIterator[tuple[EtcdStore, EtcdStore]]:
    """Two stores on the session etcd, in two namespaces."""
    a = await EtcdStore.connect([etcd_server.endpoint], namespace=unique_namespace())
    b = await EtcdStore.connect([f"http://{etcd_server.endpoint}"], namespace=unique_namespace())
    try:
        yield a, b
    finally:
        for store in (a, b):
            await store.delete_prefix("/")
            await store.close()


async def test_etcd_namespaces_are_isolated(
    etcd_server: EtcdServer, etcd_pair: tuple[EtcdStore, EtcdStore]
) -> None:
    a, b = etcd_pair
    async with b.watch("/") as b_watch:
        rev = await a.put("/k", "a")
        await a.put("/dir/x", 1)
        assert await b.get("/k") is None
        assert await b.list("/") == []
        assert await b.delete_prefix("/") == 0
        assert await b.delete("/k") is False
        assert await b.compare_and_set("/k", "b", expected_version=None) is True  # b's own /k
        own = await next_event(b_watch)
    assert (own.key, own.value) == ("/k", "b")
    assert await a.get("/k") == KeyValue("/k", "a", rev)
    # The default namespace "" stores keys exactly as given: a's keys sit under its namespace.
    raw = await EtcdStore.connect([etcd_server.endpoint])
    try:
        assert raw.namespace == ""
        assert await raw.get(a.namespace + "/k") == KeyValue(a.namespace + "/k", "a", rev)
        assert [kv.key for kv in await raw.list(a.namespace + "/")] == [
            a.namespace + "/dir/x",
            a.namespace + "/k",
        ]
    finally:
        await raw.close()


async def test_etcd_connect_tries_endpoints_in_order(etcd_server: EtcdServer) -> None:
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    store = await EtcdStore.connect([dead, etcd_server.endpoint], namespace=unique_namespace(), timeout=2)
    try:
        assert store.endpoint == etcd_server.endpoint
        assert await store.put("/x", 1) > 0
        await store.delete_prefix("/")
    finally:
        await store.close()
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(MetadataError, match="cannot reach etcd"):
        await EtcdStore.connect([dead], timeout=2)
    assert loop.time() - started < 2 * 2 + 1


@pytest.mark.parametrize("endpoints", [[], [""], ["https://127.0.0.1:2379"], ["127.0.0.1:notaport"]])
async def test_etcd_connect_rejects_bad_endpoints(endpoints: list[str]) -> None:
    with pytest.raises(InvalidArgument):
        await EtcdStore.connect(endpoints)


@pytest.mark.parametrize("namespace", ["prod", "/prod/", "/nul\x00", 7])
async def test_etcd_connect_rejects_bad_namespaces(etcd_server: EtcdServer, namespace: Any) -> None:
    with pytest.raises(InvalidArgument):
        await EtcdStore.connect([etcd_server.endpoint], namespace=namespace)


async def test_etcd_lease_minimum_and_expiry(etcd_server: EtcdServer) -> None:
    store = await EtcdStore.connect([etcd_server.endpoint], namespace=unique_namespace())
    try:
        loop = asyncio.get_running_loop()
        granted = loop.time()
        lease = await store.grant_lease(0.2)  # etcd raises it to its 2 s minimum
        await store.put("/le/k", 1, lease=lease)
        async with store.watch("/le/") as watch:
            event = await next_event(watch)
        assert (event.kind, event.key) == ("delete", "/le/k")
        assert loop.time() - granted >= ETCD_MIN_TTL - 0.6  # not 0.2 s: the minimum applied
        with pytest.raises(LeaseNotFound):
            await store.keep_alive(lease)
        with pytest.raises(LeaseNotFound):
            await store.put("/le/late", 1, lease=lease)
        with pytest.raises(LeaseNotFound):
            await store.keep_alive(2**64)  # not an id etcd can have granted
        await store.revoke_lease(lease)  # no-op for a lease that is gone
        assert await store.list("/le/") == []
    finally:
        await store.close()


async def test_etcd_close_finishes_watches(etcd_server: EtcdServer) -> None:
    store = await EtcdStore.connect([etcd_server.endpoint], namespace=unique_namespace())
    watch = store.watch("/")
    await store.close()
    async with asyncio.timeout(WAIT):
        assert [e async for e in watch] == []
    with pytest.raises(MetadataError, match="closed"):
        await store.get("/a")
    with pytest.raises(MetadataError, match="closed"):
        store.watch("/")
    await store.close()  # idempotent


async def until_answers(store: MetadataStore, seconds: float) -> None:
    """Retry a real request until the store answers again (the server restarts meanwhile)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        try:
            await store.get("/probe")
            return
        except MetadataError:
            if loop.time() >= deadline:
                raise
            await asyncio.sleep(0.05)  # poll interval


def private_etcd(directory: Path) -> EtcdServer:
    """An etcd of the test's own (for restarts), not the session one."""
    if etcd_binary() is None:
        pytest.skip("etcd is not installed (apt-get install etcd-server)")
    server = EtcdServer(directory)
    server.start()
    return server


async def test_etcd_survives_restart(tmp_path: Path) -> None:
    server = private_etcd(tmp_path / "etcd")
    timeout = 2.0
    store = await EtcdStore.connect([server.endpoint], timeout=timeout)
    cache = LocalCache(store, ["/rs/"])
    try:
        before = await store.put("/rs/a", "a")
        await cache.start()
        watch = store.watch("/rs/")
        await store.put("/rs/b", "b")
        assert (await next_event(watch)).key == "/rs/b"
        assert await cache.wait_for(lambda: cache.get("/rs/b") is not None, WAIT)

        server.kill()
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(MetadataError):
            await store.put("/rs/down", 1)
        with pytest.raises(MetadataError):
            await store.list("/rs/")
        assert loop.time() - started < 2 * timeout  # fails fast, within the deadline
        with pytest.raises(MetadataError):
            await next_event(watch)  # the watch fails so its consumer re-lists and watches again
        assert watch.closed

        # Same ports, same data; in a thread so the loop (and the cache's retries) run while etcd is down.
        await asyncio.to_thread(server.start)
        await until_answers(store, 10)
        assert await store.get("/rs/a") == KeyValue("/rs/a", "a", before)  # the data survived
        after = await store.put("/rs/c", "c")
        assert after > before  # revisions keep increasing across the restart
        async with store.watch("/rs/") as again:
            await store.delete("/rs/a")
            assert (await next_event(again)).key == "/rs/a"
        # The cache re-followed on its own and converges on the new state.
        assert await cache.wait_for(
            lambda: [kv.key for kv in cache.list("/rs/")] == ["/rs/b", "/rs/c"], 3 * WAIT
        )
    finally:
        await cache.close()
        await store.close()
        server.stop()


async def test_etcd_watch_from_compacted_revision_lags(tmp_path: Path) -> None:
    server = private_etcd(tmp_path / "etcd")  # compaction would disturb other tests on the session etcd
    stale = await EtcdStore.connect([server.endpoint])
    writer = await EtcdStore.connect([server.endpoint])
    try:
        for i in range(3):
            last = await writer.put(f"/cp/{i}", i)
        await writer._call("compact", lambda c: c.kv.Compact(rpc.CompactionRequest(revision=last), timeout=2))
        # `stale` saw nothing since it connected: its watch starts below the compacted revision.
        with pytest.raises(WatchLagged):
            await next_event(stale.watch("/cp/"))
        assert [kv.value for kv in await stale.list("/cp/")] == [0, 1, 2]  # re-list, then watch again
        async with stale.watch("/cp/") as watch:
            rev = await writer.put("/cp/3", 3)
            assert (await next_event(watch)).revision == rev
    finally:
        await stale.close()
        await writer.close()
        server.stop()


async def test_etcd_fails_over_to_the_next_endpoint(tmp_path: Path, etcd_server: EtcdServer) -> None:
    first = private_etcd(tmp_path / "etcd")
    namespace = unique_namespace()
    store = await EtcdStore.connect([first.endpoint, etcd_server.endpoint], namespace=namespace, timeout=2)
    try:
        assert store.endpoint == first.endpoint
        watch = store.watch("/fo/")
        await store.put("/fo/a", 1)
        assert (await next_event(watch)).key == "/fo/a"
        first.kill()
        with pytest.raises(MetadataError):
            await store.put("/fo/b", 2)  # fails, and makes the store look for another endpoint
        with pytest.raises(MetadataError):
            await next_event(watch)
        await until_answers(store, WAIT)
        assert store.endpoint == etcd_server.endpoint
        async with store.watch("/fo/") as again:  # new watches follow the new endpoint
            await store.put("/fo/c", 3)
            event = await next_event(again)
        assert (event.key, event.value) == ("/fo/c", 3)
        await store.delete_prefix("/")
    finally:
        await store.close()
        first.stop()


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


async def test_cache_feed_reports_changed_keys(store: MetadataStore) -> None:
    await store.put("/cf/a/1", 1)
    cache = LocalCache(store, ["/cf/"])
    feed = cache.feed("/cf/a/")
    other = cache.feed("/cf/b/")
    await cache.start()
    try:
        assert feed.drain() == (True, {"/cf/a/1"})  # first drain: rebuild from the listing
        assert feed.drain() == (False, set())
        await store.put("/cf/a/2", 2)
        await store.put("/cf/a/2", 3)
        await store.put("/cf/b/9", 9)
        await store.delete("/cf/a/1")
        assert await cache.wait_for(lambda: cache.get("/cf/a/1") is None, WAIT)
        assert feed.drain() == (False, {"/cf/a/1", "/cf/a/2"})  # deletions included, each key once
        assert other.drain() == (True, {"/cf/b/9"})
        with pytest.raises(InvalidArgument):
            cache.feed("/elsewhere/")
    finally:
        await cache.close()


async def test_cache_feed_resets_after_a_lagged_watch() -> None:
    # The embedded store queues events without yielding, so 50 puts overflow a queue of 2 for certain
    # (over etcd, whether the watch lags depends on timing).
    store = EmbeddedStore.in_memory()
    cache = LocalCache(store, ["/cfl/"], max_queue=2)
    feed = cache.feed("/cfl/")
    await cache.start()
    try:
        feed.drain()
        for i in range(50):
            await store.put(f"/cfl/{i:02d}", i)
        assert await cache.wait_for(lambda: len(cache.list("/cfl/")) == 50, WAIT)
        reset, _ = feed.drain()
        assert reset  # the watch lagged and the prefix was listed again: consumers must rebuild
    finally:
        await cache.close()
        await store.close()


def test_cache_rejects_overlapping_prefixes() -> None:
    store = EmbeddedStore.in_memory()
    with pytest.raises(InvalidArgument):
        LocalCache(store, ["/a/", "/a/b/"])
    with pytest.raises(InvalidArgument):
        LocalCache(store, [])
    with pytest.raises(InvalidArgument):
        LocalCache(store, ["relative"])
