"""`LocalCache`: an in-memory mirror of some prefixes of a `MetadataStore`, kept current by watches.

For each prefix a task opens a watch, then lists the prefix, then applies the watched events (an event
older than what the listing already shows is skipped, by revision). When the watch lags or fails, the task
starts over (watch, re-list) with a bounded backoff. Reads are synchronous and never touch the store, so they
may be slightly behind the store; values are shared, treat them as read-only.
"""

from __future__ import annotations

import asyncio
import bisect
import builtins
import logging
from collections.abc import Callable, Iterable

from ister.core.backoff import Backoff, Retries
from ister.errors import InvalidArgument, MetadataError, Timeout, WatchLagged
from ister.limits import METADATA_TIMEOUT_SECONDS
from ister.metadata.store import DEFAULT_WATCH_QUEUE, KeyValue, MetadataStore, WatchEvent, check_key
from ister.tasks import TaskSupervisor

log = logging.getLogger(__name__)

RETRY_MIN_SECONDS = 0.1
RETRY_MAX_SECONDS = 5.0
RETRY_BACKOFF = Backoff(first=RETRY_MIN_SECONDS, cap=RETRY_MAX_SECONDS)


class ChangeFeed:
    """The keys under one prefix that changed since the last `drain()`, so a consumer can update its own
    derived state per change instead of re-scanning the prefix. `reset` is True at first and after a
    re-list (a lagged or failed watch): the consumer should then rebuild from `LocalCache.list`."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.keys: set[str] = set()
        self.reset = True

    def drain(self) -> tuple[bool, set[str]]:
        reset, changed = self.reset, self.keys
        self.reset, self.keys = False, set()
        return reset, changed


class LocalCache:
    def __init__(
        self, store: MetadataStore, prefixes: Iterable[str], *, max_queue: int = DEFAULT_WATCH_QUEUE
    ) -> None:
        self._prefixes = sorted({check_key(p, "prefix") for p in prefixes})
        if not self._prefixes:
            raise InvalidArgument("a metadata cache needs at least one prefix")
        for a, b in zip(self._prefixes, self._prefixes[1:], strict=False):
            if b.startswith(a):
                raise InvalidArgument(f"cache prefixes {a!r} and {b!r} overlap")
        self._store = store
        self._max_queue = max_queue
        self._entries: dict[str, KeyValue] = {}
        self._keys: list[str] = []  # sorted
        self._ready = {p: asyncio.Event() for p in self._prefixes}
        self._changed = asyncio.Event()
        self._tasks: TaskSupervisor | None = None  # one task per prefix, while started
        self._feeds: list[ChangeFeed] = []

    # --- lifecycle --------------------------------------------------------------------------------

    async def start(self, wait_seconds: float = METADATA_TIMEOUT_SECONDS) -> None:
        """Start following every prefix; return once each has been listed once."""
        if self._tasks is not None:
            return
        self._tasks = TaskSupervisor("metadata cache")
        for p in self._prefixes:
            self._tasks.spawn(self._follow(p), f"metadata-cache {p}")
        try:
            async with asyncio.timeout(wait_seconds):
                for event in self._ready.values():
                    await event.wait()
        except TimeoutError:
            await self.close()
            raise Timeout(f"metadata cache could not load {self._prefixes} within {wait_seconds} s") from None

    @property
    def ready(self) -> bool:
        return all(event.is_set() for event in self._ready.values())

    async def close(self) -> None:
        tasks, self._tasks = self._tasks, None
        if tasks is not None:
            await tasks.close()

    # --- reads ------------------------------------------------------------------------------------

    def get(self, key: str) -> KeyValue | None:
        return self._entries.get(key)

    def list(self, prefix: str) -> list[KeyValue]:
        """Cached entries under the prefix, sorted by key."""
        index = bisect.bisect_left(self._keys, prefix)
        found: list[KeyValue] = []
        while index < len(self._keys) and self._keys[index].startswith(prefix):
            found.append(self._entries[self._keys[index]])
            index += 1
        return found

    def count(self, prefix: str) -> int:
        """How many cached keys start with `prefix` (non-empty): two bisections, whatever the count."""
        start = bisect.bisect_left(self._keys, prefix)
        end = bisect.bisect_left(self._keys, prefix[:-1] + chr(ord(prefix[-1]) + 1))
        return end - start

    def feed(self, prefix: str) -> ChangeFeed:
        """A new feed of the keys changed under `prefix` (which must lie within a cached prefix)."""
        check_key(prefix, "prefix")
        if not any(prefix.startswith(p) for p in self._prefixes):
            raise InvalidArgument(f"prefix {prefix!r} is not cached")
        feed = ChangeFeed(prefix)
        self._feeds.append(feed)
        return feed

    def change_event(self) -> asyncio.Event:
        """An event set at the next change of the cache (take it before reading, then wait on it)."""
        return self._changed

    async def wait_for(self, predicate: Callable[[], bool], wait_seconds: float) -> bool:
        """Wait until `predicate()` holds (re-checked after each change); False on timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_seconds
        while not predicate():
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            try:
                async with asyncio.timeout(remaining):  # not wait_for: it can swallow a cancellation
                    await self._changed.wait()
            except TimeoutError:
                return predicate()
        return True

    # --- following --------------------------------------------------------------------------------

    async def _follow(self, prefix: str) -> None:
        retries = Retries(RETRY_BACKOFF)
        while True:
            watch = None
            try:
                watch = self._store.watch(prefix, max_queue=self._max_queue)
                async with asyncio.timeout(METADATA_TIMEOUT_SECONDS):
                    snapshot = await self._store.list(prefix)
                self._replace(prefix, snapshot)
                self._ready[prefix].set()
                retries.reset()
                async for event in watch:
                    self._apply(event)
                return  # the store closed the watch: it is shutting down
            except WatchLagged:
                log.warning("metadata cache watch on %r lagged; re-listing", prefix)
            except (MetadataError, TimeoutError) as exc:
                delay = retries.next()
                log.warning("metadata cache on %r failed (%s); retrying in %.1f s", prefix, exc, delay)
                await asyncio.sleep(delay)
            finally:
                if watch is not None:
                    watch.close()

    def _replace(self, prefix: str, snapshot: builtins.list[KeyValue]) -> None:
        for feed in self._feeds:
            if feed.prefix.startswith(prefix) or prefix.startswith(feed.prefix):
                feed.reset = True
        fresh = {kv.key: kv for kv in snapshot}
        for key in [kv.key for kv in self.list(prefix) if kv.key not in fresh]:
            self._remove(key)
        for kv in snapshot:
            self._set(kv)
        self._signal()

    def _apply(self, event: WatchEvent) -> None:
        current = self._entries.get(event.key)
        if current is not None and current.version >= event.revision:
            return  # the listing already reflects this or a later change
        if event.kind == "put":
            self._set(KeyValue(event.key, event.value, event.revision))
        elif current is not None:
            self._remove(event.key)
        self._signal()

    def _note(self, key: str) -> None:
        """Tell every feed whose prefix covers the key that it changed."""
        for feed in self._feeds:
            if key.startswith(feed.prefix):
                feed.keys.add(key)

    def _set(self, kv: KeyValue) -> None:
        self._note(kv.key)
        if kv.key not in self._entries:
            bisect.insort(self._keys, kv.key)
        self._entries[kv.key] = kv

    def _remove(self, key: str) -> None:
        self._note(key)
        del self._entries[key]
        del self._keys[bisect.bisect_left(self._keys, key)]

    def _signal(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()
