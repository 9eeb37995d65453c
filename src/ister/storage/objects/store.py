"""A small async wrapper over an obstore store: URL-based construction, timeouts, the Ister error tree.

Only this package imports obstore. Every call is bounded twice: obstore's own HTTP client has a connect
timeout, a request timeout and a bounded retry budget, and every operation here also runs under an
asyncio deadline (which covers stores without an HTTP client and streaming uploads).

Errors:
  * `NotFound`                 the object does not exist;
  * `InvalidArgument`          bad URL, option or key;
  * `ObjectStoreUnavailable`   transient (`retriable = True`; a StorageError and an Unavailable): network,
                               timeout, 5xx, local I/O error;
  * `StorageError`             permanent (`retriable = False`): permission denied, unauthenticated, conflict.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import time
import uuid
import weakref
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn
from urllib.parse import unquote, urlsplit

import obstore
from obstore import exceptions as obs_exc
from obstore.store import LocalStore, MemoryStore, from_url

from ister.errors import InvalidArgument, NotFound, StorageError, Unavailable
from ister.limits import MiB

from .metrics import count_error, requests
from .options import split_options

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from obstore.store import ObjectStore as ObstoreStore

DEFAULT_MULTIPART_THRESHOLD = 8 * MiB
DEFAULT_PART_SIZE = 8 * MiB  # S3 parts must be >= 5 MiB (except the last)
MIN_PART_SIZE = 5 * MiB
DEFAULT_OP_TIMEOUT = 60.0  # seconds for one operation on a small object
UPLOAD_SECONDS_PER_MIB = 1.0  # added to the deadline of puts and whole-object gets, per MiB
MULTIPART_CONCURRENCY = 4  # parts in flight (bounds memory: about this many x part size)
# Operations at once on a local (file://) store. obstore does local file I/O on a thread pool of its own
# that grows with the operations in flight (about 8 threads per concurrent operation, 250+ at 64); one at
# a time keeps it to a few threads and still does about 2,000 small operations a second.
LOCAL_CONCURRENCY = 1
# Streamed objects on a local store are written by Ister itself and fdatasync'd every this many bytes: the
# disk then takes a 64 MiB object in small steps between the WAL's fdatasyncs instead of as one burst of
# write-back that stalls them (an e2e p99 of 8-12 ms after a large publish, 3 ms without the burst).
LOCAL_SYNC_BYTES = 1 * MiB
LOCAL_STAGING_DIR = ".ister-staging"  # under the store's root: outside every topic's prefix
# A staging file this old is what a crash left (a put takes seconds; another broker sharing the directory
# may be writing the younger ones): removed when the store is opened.
STALE_STAGING_SECONDS = 3600.0
MAX_LIST_RESULTS = 100_000
MAX_KEY_BYTES = 1024  # S3's limit
PROBE_KEY = "ister-start-probe"  # `probe()` asks for it; nothing writes it

_CLOUD_SCHEMES = frozenset({"s3", "s3a", "gs", "az", "azure", "abfs", "abfss", "adl"})
_BAD_KEY = re.compile(r"(^|/)\.{1,2}(/|$)|//|[\x00-\x1f]")


class ObjectStoreUnavailable(StorageError, Unavailable):
    """A transient object-store failure (network, timeout, server error): the same call may succeed later.

    A StorageError (storage callers catch it as such) and an Unavailable (so the wire answers UNAVAILABLE,
    which clients retry, as for every retriable error)."""

    retriable = True


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size: int
    etag: str | None


@dataclass(frozen=True, slots=True)
class PutInfo:
    size: int
    etag: str | None


def _is_panic(exc: BaseException) -> bool:
    return type(exc).__name__ == "PanicException"


def _open_staging(path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)


def _write_synced(fd: int, data: bytes) -> None:
    view = memoryview(data)
    for at in range(0, len(view), LOCAL_SYNC_BYTES):
        piece = view[at : at + LOCAL_SYNC_BYTES]
        while piece:
            piece = piece[os.write(fd, piece) :]
        os.fdatasync(fd)


def _close_synced(fd: int) -> None:
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _rename_into_place(staging: Path, final: Path) -> None:
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(staging, final)
    dir_fd = os.open(final.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _remove_stale_staging(directory: Path) -> None:
    """Delete staging files left by a crash (best effort: a failure here only leaves them for later)."""
    cutoff = time.time() - STALE_STAGING_SECONDS
    with contextlib.suppress(OSError):
        for entry in os.scandir(directory):
            with contextlib.suppress(OSError):
                if entry.name.endswith(".part") and entry.stat().st_mtime < cutoff:
                    os.unlink(entry.path)
                    log.warning("removed %s, an object write a crash left unfinished", entry.path)


def _discard_staged(fd: int | None, staging: Path) -> None:
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)
    staging.unlink(missing_ok=True)


def translate_error(exc: BaseException, what: str) -> StorageError | InvalidArgument | NotFound:
    """Map an obstore (or OS, or timeout) exception to the Ister error tree."""
    text = str(exc).split("\n", 1)[0][:500]
    if isinstance(exc, FileNotFoundError | obs_exc.NotFoundError):
        return NotFound(f"{what}: object not found")
    if isinstance(exc, TimeoutError):
        return ObjectStoreUnavailable(f"{what}: timed out")
    if isinstance(exc, obs_exc.PermissionDeniedError | obs_exc.UnauthenticatedError | PermissionError):
        return StorageError(f"{what}: access denied: {text}")
    if isinstance(exc, obs_exc.InvalidPathError | obs_exc.UnknownConfigurationKeyError):
        return InvalidArgument(f"{what}: {text}")
    if isinstance(exc, obs_exc.AlreadyExistsError | obs_exc.PreconditionError | obs_exc.NotSupportedError):
        return StorageError(f"{what}: {text}")
    if isinstance(exc, obs_exc.BaseError | OSError) or _is_panic(exc):
        # GenericError carries network failures, exhausted retries and 5xx answers; OSError is local I/O.
        return ObjectStoreUnavailable(f"{what}: {text}")
    return ObjectStoreUnavailable(f"{what}: {type(exc).__name__}: {text}")


def _raise(exc: BaseException, what: str, operation: str) -> NoReturn:
    translated = translate_error(exc, what)
    count_error(operation, translated)
    raise translated from exc


def check_key(key: str) -> str:
    """An object key: relative ('a/b/c'), no empty, '.' or '..' segments, no control characters."""
    if not isinstance(key, str) or not key or key.startswith("/") or key.endswith("/"):
        raise InvalidArgument(f"invalid object key {key!r}: must be a relative path like 'a/b/c'")
    if _BAD_KEY.search(key) or len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        raise InvalidArgument(f"invalid object key {key!r}")
    return key


def _check_prefix(prefix: str) -> str:
    if prefix == "":
        return prefix
    check_key(prefix.rstrip("/"))
    return prefix


class ObjectStore:
    """Async object access with timeouts. Build one with `open_store(url, options)`."""

    def __init__(
        self,
        store: ObstoreStore,
        url: str,
        *,
        op_timeout: float = DEFAULT_OP_TIMEOUT,
        multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD,
        part_size: int = DEFAULT_PART_SIZE,
    ) -> None:
        if op_timeout <= 0:
            raise InvalidArgument("object store op_timeout must be > 0")
        if part_size < MIN_PART_SIZE:
            raise InvalidArgument(f"object store part_size must be >= {MIN_PART_SIZE}")
        if multipart_threshold < part_size:
            raise InvalidArgument("object store multipart_threshold must be >= part_size")
        self._store = store
        self.url = url
        self._local = isinstance(store, LocalStore)
        self.local_root: Path | None = None  # set by open_store for file:// stores
        self._gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )
        self.op_timeout = op_timeout
        self.multipart_threshold = multipart_threshold
        self.part_size = part_size

    def __repr__(self) -> str:
        return f"ObjectStore({self.url!r})"

    def _deadline(self, nbytes: int = 0) -> float:
        return self.op_timeout + UPLOAD_SECONDS_PER_MIB * nbytes / MiB

    @contextlib.asynccontextmanager
    async def _turn(self) -> AsyncIterator[None]:
        """Local stores: wait for one of LOCAL_CONCURRENCY turns (each operation is bounded by its own
        deadline, so the wait is too). Other stores: at once."""
        if not self._local:
            yield
            return
        loop = asyncio.get_running_loop()
        gate = self._gates.get(loop)
        if gate is None:
            gate = self._gates[loop] = asyncio.Semaphore(LOCAL_CONCURRENCY)
        async with gate:
            yield

    async def put(self, key: str, data: bytes | bytearray | memoryview) -> PutInfo:
        """Write a whole object atomically (a multipart upload above `multipart_threshold`)."""
        check_key(key)
        requests.labels("put").inc()
        size = len(data)
        what = f"put {key!r} ({size} bytes) to {self.url}"
        try:
            async with self._turn(), asyncio.timeout(self._deadline(size)):
                result = await obstore.put_async(
                    self._store,
                    key,
                    data,
                    use_multipart=size > self.multipart_threshold,
                    chunk_size=self.part_size,
                    max_concurrency=MULTIPART_CONCURRENCY,
                )
        except Exception as exc:
            _raise(exc, what, "put")
        return PutInfo(size, result.get("e_tag"))

    async def put_stream(self, key: str, chunks: AsyncIterable[bytes], size_hint: int) -> PutInfo:
        """Write an object from chunks with a multipart upload; nothing is visible unless it completes.

        An exception raised by `chunks` aborts the upload and is re-raised as is (if it is an IsterError).
        `size_hint` (total bytes, roughly) only sizes the deadline.
        """
        check_key(key)
        requests.labels("put").inc()
        what = f"put {key!r} (multipart, about {size_hint} bytes) to {self.url}"
        counted = 0

        async def counting() -> AsyncIterable[bytes]:
            nonlocal counted
            async for chunk in chunks:
                counted += len(chunk)
                yield chunk

        try:
            if self.local_root is not None:
                # Not a turn of obstore's local thread pool (the turns bound it): reads of other objects
                # go on while this write paces itself to the disk.
                async with asyncio.timeout(self._deadline(size_hint)):
                    return PutInfo(await self._put_local_paced(self.local_root, key, counting()), None)
            async with self._turn(), asyncio.timeout(self._deadline(size_hint)):
                result = await obstore.put_async(
                    self._store,
                    key,
                    counting(),
                    use_multipart=True,
                    chunk_size=self.part_size,
                    max_concurrency=MULTIPART_CONCURRENCY,
                )
        except (StorageError, InvalidArgument, NotFound) as exc:
            count_error("put", exc)
            raise
        except Exception as exc:
            _raise(exc, what, "put")
        return PutInfo(counted, result.get("e_tag"))

    @staticmethod
    async def _put_local_paced(root: Path, key: str, chunks: AsyncIterable[bytes]) -> int:
        """Write `key` under `root` from `chunks` in a staging file, fdatasync'ing every LOCAL_SYNC_BYTES,
        then fsync it, rename it into place and sync its directory: visible whole or not at all, and on disk
        once this returns. The staging file is removed if anything fails. Returns the size."""
        final = root / key
        staging = root / LOCAL_STAGING_DIR / f"{uuid.uuid4().hex}.part"
        fd = await asyncio.to_thread(_open_staging, staging)
        is_open = True
        size = 0
        try:
            async for chunk in chunks:
                await asyncio.to_thread(_write_synced, fd, chunk)
                size += len(chunk)
            is_open = False
            await asyncio.to_thread(_close_synced, fd)
            await asyncio.to_thread(_rename_into_place, staging, final)
        except BaseException:
            await asyncio.to_thread(_discard_staged, fd if is_open else None, staging)
            raise
        return size

    async def get(self, key: str) -> bytes:
        """The whole object."""
        check_key(key)
        requests.labels("get").inc()
        what = f"get {key!r} from {self.url}"
        try:
            async with self._turn():
                async with asyncio.timeout(self.op_timeout):
                    result = await obstore.get_async(self._store, key)
                async with asyncio.timeout(self._deadline(int(result.meta["size"]))):
                    return bytes(await result.bytes_async())
        except Exception as exc:
            _raise(exc, what, "get")

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of the object (fewer if the object ends before `end`)."""
        check_key(key)
        requests.labels("get").inc()
        if not 0 <= start < end:
            raise InvalidArgument(f"invalid byte range [{start}, {end})")
        what = f"get {key!r} bytes [{start}, {end}) from {self.url}"
        try:
            async with self._turn(), asyncio.timeout(self._deadline(end - start)):
                return bytes(await obstore.get_range_async(self._store, key, start=start, end=end))
        except Exception as exc:
            _raise(exc, what, "get")

    async def get_tail(self, key: str, length: int) -> tuple[bytes, int]:
        """The last `length` bytes (the whole object if it is shorter) and the object's size: one GET."""
        check_key(key)
        requests.labels("get").inc()
        if length < 1:
            raise InvalidArgument("tail length must be >= 1")
        what = f"get the last {length} bytes of {key!r} from {self.url}"
        try:
            async with self._turn(), asyncio.timeout(self._deadline(length)):
                result = await obstore.get_async(self._store, key, options={"range": {"suffix": length}})
                data = bytes(await result.bytes_async())
                size = int(result.meta["size"])
        except Exception as exc:
            _raise(exc, what, "get")
        if len(data) > size or len(data) != min(length, size):
            short = ObjectStoreUnavailable(f"{what}: got {len(data)} bytes of a {size}-byte object")
            count_error("get", short)
            raise short
        return data, size

    async def head(self, key: str) -> ObjectInfo:
        check_key(key)
        requests.labels("head").inc()
        what = f"head {key!r} in {self.url}"
        try:
            async with self._turn(), asyncio.timeout(self.op_timeout):
                meta = await obstore.head_async(self._store, key)
        except Exception as exc:
            _raise(exc, what, "head")
        return ObjectInfo(str(meta["path"]), int(meta["size"]), meta.get("e_tag"))

    async def probe(self) -> None:
        """One request that proves the store answers (a broker's first reach at start): a HEAD of a key
        nobody writes, so "not found" is the answer expected."""
        with contextlib.suppress(NotFound):
            await self.head(PROBE_KEY)

    async def list(self, prefix: str = "", *, limit: int = MAX_LIST_RESULTS) -> list[ObjectInfo]:
        """Objects under `prefix` (whole path segments: 'a/b' matches 'a/b/c', not 'a/bc'), sorted by key.

        Raises StorageError if more than `limit` objects match.
        """
        _check_prefix(prefix)
        requests.labels("list").inc()
        what = f"list {prefix!r} in {self.url}"
        found: list[ObjectInfo] = []
        try:
            async with self._turn(), asyncio.timeout(self.op_timeout):
                stream = obstore.list(self._store, prefix.rstrip("/") or None, chunk_size=1000)
                async for batch in stream:
                    for meta in batch:
                        found.append(ObjectInfo(str(meta["path"]), int(meta["size"]), meta.get("e_tag")))
                    if len(found) > limit:
                        raise StorageError(f"{what}: more than {limit} objects")
        except StorageError as exc:
            count_error("list", exc)
            raise
        except Exception as exc:
            _raise(exc, what, "list")
        found.sort(key=lambda info: info.key)
        return found

    async def delete(self, key: str) -> None:
        """Delete an object; deleting a missing object is not an error."""
        check_key(key)
        requests.labels("delete").inc()
        what = f"delete {key!r} from {self.url}"
        try:
            async with self._turn(), asyncio.timeout(self.op_timeout):
                await obstore.delete_async(self._store, key)
        except FileNotFoundError:
            return
        except Exception as exc:
            _raise(exc, what, "delete")


def open_store(
    url: str,
    options: Mapping[str, str] | None = None,
    *,
    op_timeout: float = DEFAULT_OP_TIMEOUT,
    multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD,
    part_size: int = DEFAULT_PART_SIZE,
) -> ObjectStore:
    """An `ObjectStore` for a URL:

    * `memory://` (a fresh in-memory store: tests),
    * `file:///absolute/dir` (a local or mounted filesystem; the directory is created),
    * `s3://bucket[/prefix]`, `gs://bucket[/prefix]`, `az://container[/prefix]` (and obstore's other
      cloud URL forms), configured by `options` (obstore's config keys such as `endpoint`, `region`,
      `access_key_id`, `secret_access_key`; HTTP client keys such as `allow_http`, `timeout`,
      `connect_timeout`; ours: `max_retries`, `retry_timeout`) and by the standard environment variables
      (`AWS_*`, `GOOGLE_*`, `AZURE_*`, client settings such as `AWS_ALLOW_HTTP` included); options win
      over the environment. An `http://` endpoint, from either, allows plain HTTP unless `allow_http`
      says otherwise.

    Raises InvalidArgument for a bad URL or option.
    """
    options = dict(options or {})
    if not isinstance(url, str) or not url:
        raise InvalidArgument(f"invalid object store URL {url!r}")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    kwargs: dict[str, Any] = {
        "op_timeout": op_timeout,
        "multipart_threshold": multipart_threshold,
        "part_size": part_size,
    }
    if scheme == "memory":
        if options:
            raise InvalidArgument("a memory:// object store takes no options")
        return ObjectStore(MemoryStore(), url, **kwargs)
    if scheme == "file":
        if options:
            raise InvalidArgument("a file:// object store takes no options")
        if parts.netloc not in ("", "localhost"):
            raise InvalidArgument(f"invalid file URL {url!r}: expected file:///absolute/path")
        path = Path(unquote(parts.path))
        if not path.is_absolute() or ".." in path.parts:
            raise InvalidArgument(f"invalid file URL {url!r}: expected file:///absolute/path")
        try:
            path.mkdir(parents=True, exist_ok=True)
            local = LocalStore(path, mkdir=True)
        except OSError as exc:
            raise StorageError(f"cannot create object store directory {path}: {exc}") from exc
        except Exception as exc:
            raise InvalidArgument(f"invalid file URL {url!r}: {exc}") from exc
        store = ObjectStore(local, url, **kwargs)
        store.local_root = path
        _remove_stale_staging(path / LOCAL_STAGING_DIR)
        return store
    if scheme not in _CLOUD_SCHEMES or not parts.netloc:
        raise InvalidArgument(
            f"unsupported object store URL {url!r}: expected memory://, file:///dir, s3://bucket/prefix, "
            "gs://bucket/prefix or az://container/prefix"
        )
    if parts.query or parts.fragment:
        raise InvalidArgument(f"invalid object store URL {url!r}: no query or fragment allowed")
    config, client, retry = split_options(options, scheme=scheme)
    try:
        store = from_url(url, config=config, client_options=client, retry_config=retry)  # type: ignore[call-overload]
    except Exception as exc:
        raise InvalidArgument(f"invalid object store {url!r}: {str(exc).splitlines()[0][:300]}") from exc
    except BaseException as exc:  # obstore panics (a Rust panic, a BaseException) on some bad option values
        if _is_panic(exc):
            raise InvalidArgument(f"invalid object store options for {url!r}: {exc}") from None
        raise
    return ObjectStore(store, url, **kwargs)


__all__ = [
    "DEFAULT_MULTIPART_THRESHOLD",
    "DEFAULT_PART_SIZE",
    "ObjectInfo",
    "ObjectStore",
    "ObjectStoreUnavailable",
    "PutInfo",
    "check_key",
    "open_store",
    "translate_error",
]
