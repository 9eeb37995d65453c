"""The metadata store contract: value types, the `MetadataStore` protocol and the backend-neutral `Watch`.

Semantics every backend honours (the contract suite in `tests/unit/test_metadata_contract.py` checks them):

* Keys are strings that start with '/'; values are JSON-compatible objects (u64 and larger ints stay ints).
* Every mutation gets a global revision that only increases (also across restarts). `KeyValue.version` is the
  revision of the key's last modification; `compare_and_set`/`compare_and_delete` compare against it.
* `list` returns keys in byte order and is bounded: more than `MAX_LIST_RESULTS` matches raise
  `ListTooLarge` unless the caller passes `limit` (then at most `limit` entries; page on with `start_after`).
* A `Watch` reports every put/delete under its prefix made after it was created, in revision order. It holds
  at most `max_queue` undelivered events; a watcher that falls further behind gets `WatchLagged` on its next
  iteration (its queue is dropped, memory stays bounded), after which it must re-list and watch again.
* Leases: keys put with a lease are deleted (with delete events) when the lease expires or is revoked.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol

import msgspec

from ister.errors import InvalidArgument, MetadataError, WatchLagged
from ister.ids import shown

MAX_KEY_BYTES = 4096
MAX_VALUE_BYTES = 1024 * 1024  # etcd refuses requests above 1.5 MiB by default; stay below it
MAX_LIST_RESULTS = 100_000
DEFAULT_WATCH_QUEUE = 1024
MAX_TXN_OPS = 64  # etcd's default --max-txn-ops is 128


class KeyValue(msgspec.Struct, frozen=True):
    key: str
    value: Any  # JSON-decoded
    version: int  # revision of the key's last modification (> 0)


class WatchEvent(msgspec.Struct, frozen=True):
    kind: Literal["put", "delete"]
    key: str
    value: Any | None  # the new value for a put, None for a delete
    revision: int


class Compare(msgspec.Struct, frozen=True):
    """A transaction guard: the key's version is `version`, or the key is absent when `version` is None."""

    key: str
    version: int | None


class Put(msgspec.Struct, frozen=True):
    key: str
    value: Any
    lease: int | None = None


class Delete(msgspec.Struct, frozen=True):
    key: str


Op = Put | Delete


class LeaseNotFound(MetadataError):
    """The lease does not exist (never granted, expired or revoked)."""

    retriable = False


class ListTooLarge(MetadataError):
    """A listing matched more keys than its bound; pass `limit` and page with `start_after`."""

    retriable = False


# --- validation and encoding shared by backends ---------------------------------------------------


def check_key(key: object, what: str = "key") -> str:
    """A metadata key (or prefix): a str starting with '/', no NUL, at most MAX_KEY_BYTES of UTF-8."""
    if not isinstance(key, str) or not key.startswith("/"):
        raise InvalidArgument(f"invalid metadata {what} {shown(key)}: must be a string starting with '/'")
    if "\x00" in key:
        raise InvalidArgument(f"invalid metadata {what} {shown(key)}: contains a NUL character")
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidArgument(f"invalid metadata {what} {shown(key)}: not valid UTF-8") from exc
    if size > MAX_KEY_BYTES:
        raise InvalidArgument(f"invalid metadata {what}: {size} bytes, limit {MAX_KEY_BYTES}")
    return key


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()


def encode_value(value: Any) -> bytes:
    """JSON bytes of a value; InvalidArgument if it is not JSON-compatible or too large."""
    try:
        raw = _encoder.encode(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidArgument(f"metadata value is not JSON-compatible: {exc}") from exc
    if len(raw) > MAX_VALUE_BYTES:
        raise InvalidArgument(f"metadata value is {len(raw)} bytes, limit {MAX_VALUE_BYTES}")
    return raw


def decode_value(raw: bytes | memoryview, key: str) -> Any:
    try:
        return _decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise MetadataError(f"metadata value of {key!r} is not valid JSON: {exc}") from exc


def check_limit(limit: int | None) -> int:
    if limit is None:
        return MAX_LIST_RESULTS
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidArgument(f"invalid list limit {limit!r}: expected a positive integer")
    return limit


# --- watch ----------------------------------------------------------------------------------------


class Watch:
    """An async iterator of `WatchEvent`s under one prefix, with a bounded queue.

    Backends call `feed` (never blocks), `fail` (deliver the queued events, then raise the error) and
    `finish` (end the iteration). Consumers iterate and call `close()` when done (also via `async with`).
    """

    def __init__(
        self,
        prefix: str,
        max_queue: int = DEFAULT_WATCH_QUEUE,
        on_close: Callable[[Watch], None] | None = None,
    ) -> None:
        if isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 1:
            raise InvalidArgument(f"invalid watch queue size {max_queue!r}: expected a positive integer")
        self.prefix = prefix
        self.max_queue = max_queue
        self._events: deque[WatchEvent] = deque()
        self._wakeup = asyncio.Event()
        self._error: MetadataError | None = None
        self._done = False  # no more events will be fed
        self._on_close = on_close

    @property
    def closed(self) -> bool:
        return self._done

    # backend side

    def feed(self, event: WatchEvent) -> None:
        if self._done:
            return
        if len(self._events) >= self.max_queue:
            self._events.clear()
            self.fail(
                WatchLagged(
                    f"watch on {self.prefix!r} fell more than {self.max_queue} events behind; "
                    "re-list and watch again"
                )
            )
            return
        self._events.append(event)
        self._wakeup.set()

    def fail(self, error: MetadataError) -> None:
        if self._done:
            return
        self._error = error
        self._finish()

    def finish(self) -> None:
        self._finish()

    def _finish(self) -> None:
        if self._done:
            return
        self._done = True
        self._wakeup.set()
        callback, self._on_close = self._on_close, None
        if callback is not None:
            callback(self)

    # consumer side

    def close(self) -> None:
        """Stop watching; pending events are dropped and iteration ends."""
        self._events.clear()
        self._error = None
        self._finish()

    def __aiter__(self) -> Watch:
        return self

    async def __anext__(self) -> WatchEvent:
        while True:
            if self._events:
                return self._events.popleft()
            if self._error is not None:
                error, self._error = self._error, None
                raise error
            if self._done:
                raise StopAsyncIteration
            self._wakeup.clear()
            await self._wakeup.wait()

    async def __aenter__(self) -> Watch:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()


# --- protocol -------------------------------------------------------------------------------------


class MetadataStore(Protocol):
    async def get(self, key: str) -> KeyValue | None: ...

    async def put(self, key: str, value: Any, *, lease: int | None = None) -> int:
        """Write unconditionally; returns the new revision. Without `lease` the key belongs to no lease."""
        ...

    async def delete(self, key: str) -> bool:
        """True if the key existed."""
        ...

    async def delete_prefix(self, prefix: str) -> int:
        """Delete every key under the prefix (one revision for all); returns how many were deleted."""
        ...

    async def list(
        self, prefix: str, *, limit: int | None = None, start_after: str | None = None
    ) -> list[KeyValue]:
        """Keys under the prefix in byte order, strictly after `start_after` if given.

        Without `limit`, raises `ListTooLarge` when more than MAX_LIST_RESULTS keys match.
        """
        ...

    async def compare_and_set(
        self, key: str, value: Any, *, expected_version: int | None, lease: int | None = None
    ) -> bool:
        """Put only if the key is absent (`expected_version=None`) or its version is `expected_version`."""
        ...

    async def compare_and_delete(self, key: str, *, expected_version: int) -> bool: ...

    async def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> bool:
        """Apply every op atomically (one revision, watchers see each put/delete) if every compare holds.

        Returns False and changes nothing when a compare fails. At most MAX_TXN_OPS ops, each key at most
        once among the ops; a Put's lease must be live (`LeaseNotFound` otherwise, nothing applied).
        """
        ...

    def watch(self, prefix: str, *, max_queue: int = DEFAULT_WATCH_QUEUE) -> Watch: ...

    async def grant_lease(self, ttl_seconds: float) -> int: ...

    async def keep_alive(self, lease_id: int) -> None:
        """Restart the lease's TTL; `LeaseNotFound` if it expired or never existed."""
        ...

    async def revoke_lease(self, lease_id: int) -> None:
        """Delete the lease's keys (watchers see deletes); a no-op for an unknown lease."""
        ...

    async def close(self) -> None: ...


LIST_PAGE = 1_000


async def list_all(store: MetadataStore, prefix: str) -> list[KeyValue]:
    """Every key under the prefix, page by page (never `ListTooLarge`)."""
    out: list[KeyValue] = []
    after: str | None = None
    while True:
        page = await store.list(prefix, limit=LIST_PAGE, start_after=after)
        out.extend(page)
        if len(page) < LIST_PAGE:
            return out
        after = page[-1].key
