"""ister.storage.objects.store: URLs, options, operations and errors on memory:// and file:// stores."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from ister.errors import InvalidArgument, NotFound, StorageError
from ister.limits import MiB
from ister.storage.objects.options import split_options
from ister.storage.objects.store import ObjectStore, ObjectStoreUnavailable, open_store
from tests.support import free_port, small_tmpfs


@pytest.fixture(params=["memory", "file"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "memory":
        return open_store("memory://", part_size=5 * MiB, multipart_threshold=6 * MiB)
    return open_store(f"file://{tmp_path}/objects/root", part_size=5 * MiB, multipart_threshold=6 * MiB)


async def test_put_get_head_range_tail_list_delete(store: ObjectStore) -> None:
    data = bytes(range(256)) * 4
    info = await store.put("a/b/one", data)
    assert info.size == len(data)
    assert await store.get("a/b/one") == data
    assert await store.get_range("a/b/one", 10, 20) == data[10:20]
    assert await store.get_range("a/b/one", 1000, 5000) == data[1000:]  # clipped at the end
    assert await store.get_tail("a/b/one", 7) == (data[-7:], len(data))
    assert await store.get_tail("a/b/one", 10_000) == (data, len(data))  # whole object
    head = await store.head("a/b/one")
    assert (head.key, head.size) == ("a/b/one", len(data))
    await store.put("a/b/two", b"2")
    await store.put("a/bc/three", b"3")
    assert [o.key for o in await store.list("a/b")] == ["a/b/one", "a/b/two"]
    assert [o.key for o in await store.list("")] == ["a/b/one", "a/b/two", "a/bc/three"]
    with pytest.raises(StorageError, match="more than 1 objects"):
        await store.list("a", limit=1)
    await store.delete("a/b/one")
    await store.delete("a/b/one")  # missing: fine
    with pytest.raises(NotFound):
        await store.get("a/b/one")
    with pytest.raises(NotFound):
        await store.head("a/b/one")
    with pytest.raises(NotFound):
        await store.get_range("a/b/one", 0, 1)


async def test_large_put_uses_multipart_and_streams(store: ObjectStore) -> None:
    big = os.urandom(7 * MiB + 123)  # above the 6 MiB threshold: multipart, 5 MiB parts
    info = await store.put("big", big)
    assert info.size == len(big)
    assert await store.get("big") == big
    assert await store.get_range("big", 6 * MiB, 6 * MiB + 10) == big[6 * MiB : 6 * MiB + 10]

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(big), 3 * MiB):
            yield big[i : i + 3 * MiB]

    info = await store.put_stream("streamed", chunks(), len(big))
    assert info.size == len(big)
    assert await store.get("streamed") == big


async def test_failing_stream_leaves_no_object(store: ObjectStore) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b"x" * (6 * MiB)
        raise StorageError("source broke")

    with pytest.raises(StorageError, match="source broke"):
        await store.put_stream("half", chunks(), 12 * MiB)
    with pytest.raises(NotFound):
        await store.head("half")


@pytest.mark.parametrize("key", ["", "/abs", "a//b", "a/../b", "a/./b", "dir/", "a\x00b"])
async def test_bad_keys_are_invalid_argument(key: str) -> None:
    store = open_store("memory://")
    with pytest.raises(InvalidArgument):
        await store.put(key, b"x")


@pytest.mark.parametrize(
    ("url", "options"),
    [
        ("", None),
        ("ftp://host/x", None),
        ("s3://", None),
        ("file://relative/dir", None),
        ("file:///a/../b", None),
        ("memory://", {"endpoint": "x"}),
        ("s3://bucket/p?x=1", None),
        ("s3://bucket", {"no_such_option": "1"}),
        ("s3://bucket", {"allow_http": "maybe"}),
        ("s3://bucket", {"timeout": "soon"}),
        ("s3://bucket", {"max_retries": "-1"}),
    ],
)
def test_bad_urls_and_options_are_invalid_argument(url: str, options: dict[str, str] | None) -> None:
    with pytest.raises(InvalidArgument):
        open_store(url, options)


def test_cloud_urls_are_built_from_url_and_options() -> None:
    s3 = open_store(
        "s3://bucket/some/prefix",
        {
            "endpoint": "http://127.0.0.1:9",
            "region": "us-east-1",
            "access_key": "a",  # Danube's name for access_key_id
            "secret_access_key": "b",
            "timeout": "2.5",
            "connect_timeout": "1s",
            "max_retries": "0",
        },
    )
    assert s3.url == "s3://bucket/some/prefix"
    open_store("gs://bucket/prefix", {"skip_signature": "true"})
    open_store("az://container/prefix", {"account_name": "acct", "account_key": "a2V5"})


def test_file_store_creates_its_directory(tmp_path: Path) -> None:
    target = tmp_path / "x" / "y"
    open_store(f"file://{target}")
    assert target.is_dir()


async def test_unreachable_endpoint_is_retriable() -> None:
    store = open_store(
        "s3://bucket",
        {
            "endpoint": f"http://127.0.0.1:{free_port()}",
            "access_key_id": "a",
            "secret_access_key": "b",
            "region": "us-east-1",
            "max_retries": "0",
            "connect_timeout": "1s",
        },
    )
    with pytest.raises(ObjectStoreUnavailable) as info:
        await store.put("k", b"x")
    assert info.value.retriable
    with pytest.raises(ObjectStoreUnavailable):
        await store.get_range("k", 0, 1)


def test_aws_environment_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "a")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "b")
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
    store = open_store("s3://bucket/prefix")
    assert "bucket" in repr(store)


def test_environment_client_settings_are_kept_under_explicit_options() -> None:
    env = {
        "AWS_ALLOW_HTTP": "true",
        "AWS_TIMEOUT": "7s",
        "AWS_CONNECT_TIMEOUT": "2",
        "GOOGLE_TIMEOUT": "99s",  # another cloud's: not for s3://
        "aws_timeout": "1s",  # obstore reads upper-case prefixes only
    }
    _, client, _ = split_options({}, scheme="s3", environ=env)
    assert (client["allow_http"], client["timeout"], client["connect_timeout"]) == ("true", "7s", "2000ms")
    _, client, _ = split_options({"timeout": "3s", "allow_http": "false"}, scheme="s3", environ=env)
    assert (client["allow_http"], client["timeout"]) == ("false", "3s")  # explicit options win
    _, client, _ = split_options({}, scheme="gs", environ=env)
    assert client["timeout"] == "99s" and "allow_http" not in client
    _, client, _ = split_options({"aws_allow_http": "yes"}, scheme="s3", environ={})
    assert client["allow_http"] == "true"  # the prefixed option name is a client option too


@pytest.mark.parametrize("name", ["AWS_ENDPOINT", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"])
def test_plain_http_endpoint_from_the_environment_allows_http(name: str) -> None:
    _, client, _ = split_options({}, scheme="s3", environ={name: "http://127.0.0.1:8333"})
    assert client["allow_http"] == "true"
    _, client, _ = split_options({}, scheme="s3", environ={name: "https://s3.example"})
    assert "allow_http" not in client
    # An explicit https endpoint wins over the environment's http one; an explicit allow_http too.
    _, client, _ = split_options({"endpoint": "https://s3.example"}, scheme="s3", environ={name: "http://x"})
    assert "allow_http" not in client
    env = {name: "http://x", "AWS_ALLOW_HTTP": "false"}
    assert split_options({}, scheme="s3", environ=env)[1]["allow_http"] == "false"
    env = {"AZURE_STORAGE_ENDPOINT": "http://127.0.0.1:10000"}
    assert split_options({}, scheme="az", environ=env)[1]["allow_http"] == "true"


def test_bad_environment_client_setting_is_invalid_argument() -> None:
    with pytest.raises(InvalidArgument, match="AWS_ALLOW_HTTP"):
        split_options({}, scheme="s3", environ={"AWS_ALLOW_HTTP": "sometimes"})
    with pytest.raises(InvalidArgument, match="AWS_TIMEOUT"):
        split_options({}, scheme="s3", environ={"AWS_TIMEOUT": "soon"})


async def test_many_concurrent_operations_on_a_local_store_keep_threads_bounded(tmp_path: Path) -> None:
    """obstore's local file I/O runs on a thread pool that grows with the operations in flight; the
    wrapper runs them one at a time, so 64 concurrent callers do not cost hundreds of threads."""
    store = open_store((tmp_path / "objects").as_uri())
    await store.put("warm", b"x")
    before = len(os.listdir("/proc/self/task"))

    async def worker(i: int) -> None:
        for j in range(20):
            await store.put(f"w{i}/o{j}", b"%d" % j)
            assert await store.get(f"w{i}/o{j}") == b"%d" % j

    await asyncio.gather(*(worker(i) for i in range(64)))
    assert len(os.listdir("/proc/self/task")) - before <= 16
    assert len(await store.list("w1")) == 20


# ---- file:// streamed puts: written by Ister in synced steps (LOCAL_SYNC_BYTES) ----------------------------


async def test_a_local_streamed_put_is_synced_in_steps_and_leaves_no_staging_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "objects"
    store = open_store(f"file://{root}")
    synced: list[int] = []
    real_fdatasync = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (synced.append(fd), real_fdatasync(fd))[1])
    data = os.urandom(5 * MiB + 7)

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(data), 2 * MiB):
            yield data[i : i + 2 * MiB]

    info = await store.put_stream("topics/t/data-0-9.dnb1", chunks(), len(data))
    assert info.size == len(data)
    assert (root / "topics/t/data-0-9.dnb1").read_bytes() == data
    assert len(synced) >= len(data) // MiB  # one fdatasync per MiB written, not one burst at the end
    assert [o.key for o in await store.list("")] == ["topics/t/data-0-9.dnb1"]
    assert list((root / ".ister-staging").iterdir()) == []


async def test_a_failed_local_streamed_put_removes_its_staging_file(tmp_path: Path) -> None:
    root = tmp_path / "objects"
    store = open_store(f"file://{root}")

    async def chunks() -> AsyncIterator[bytes]:
        yield b"x" * MiB
        raise StorageError("source broke")

    with pytest.raises(StorageError, match="source broke"):
        await store.put_stream("topics/t/obj", chunks(), 2 * MiB)
    with pytest.raises(NotFound):
        await store.head("topics/t/obj")
    assert list((root / ".ister-staging").iterdir()) == []


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs (needs root, as the storage fault tests' disk does)."""
    with small_tmpfs(tmp_path, "4m") as mount:
        yield mount


async def test_a_full_disk_fails_a_local_streamed_put_cleanly(small_disk: Path) -> None:
    """ENOSPC halfway: a StorageError naming the object, nothing visible, no staging file left, and the
    store works again once there is room."""
    store = open_store(f"file://{small_disk}/objects")

    async def chunks(n: int) -> AsyncIterator[bytes]:
        for _ in range(n):
            yield b"y" * MiB

    with pytest.raises(StorageError, match="topics/t/big"):
        await store.put_stream("topics/t/big", chunks(8), 8 * MiB)
    with pytest.raises(NotFound):
        await store.head("topics/t/big")
    assert list((small_disk / "objects" / ".ister-staging").iterdir()) == []
    info = await store.put_stream("topics/t/small", chunks(1), MiB)
    assert info.size == MiB
    assert await store.get("topics/t/small") == b"y" * MiB


def test_opening_a_local_store_removes_only_stale_staging_files(tmp_path: Path) -> None:
    root = tmp_path / "objects"
    staging = root / ".ister-staging"
    staging.mkdir(parents=True)
    old, fresh = staging / "a.part", staging / "b.part"
    old.write_bytes(b"left by a crash")
    fresh.write_bytes(b"another broker is writing this")
    two_hours_ago = time.time() - 7200
    os.utime(old, (two_hours_ago, two_hours_ago))
    open_store(f"file://{root}")
    assert sorted(p.name for p in staging.iterdir()) == ["b.part"]


async def test_reads_go_on_while_a_local_streamed_put_is_being_written(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/objects")
    await store.put("topics/t/old", b"history")
    halfway = asyncio.Event()
    finish = asyncio.Event()

    async def chunks() -> AsyncIterator[bytes]:
        yield b"z" * MiB
        halfway.set()
        await finish.wait()  # the export's source is still producing the object
        yield b"z" * MiB

    put = asyncio.ensure_future(store.put_stream("topics/t/new", chunks(), 2 * MiB))
    await halfway.wait()
    async with asyncio.timeout(5):
        assert await store.get("topics/t/old") == b"history"
    finish.set()
    assert (await put).size == 2 * MiB


async def test_a_local_streamed_put_that_cannot_be_renamed_into_place_fails_cleanly(tmp_path: Path) -> None:
    """The last step fails (a file stands where the object's directory must be): a StorageError naming
    the object, nothing visible, the staging file removed; the blocking file is left as it was."""
    root = tmp_path / "objects"
    store = open_store(f"file://{root}")
    await store.put("topics/t", b"a file, not a directory")

    async def chunks() -> AsyncIterator[bytes]:
        yield b"w" * MiB

    with pytest.raises(StorageError, match="topics/t/obj"):
        await store.put_stream("topics/t/obj", chunks(), MiB)
    assert await store.get("topics/t") == b"a file, not a directory"
    assert list((root / ".ister-staging").iterdir()) == []
