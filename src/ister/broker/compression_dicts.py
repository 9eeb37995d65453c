"""Trained zstd dictionaries in the metadata store (docs/compression.md, "Dictionaries").

`/ister/compression-dicts/{id}` holds one dictionary, created if absent and never changed, so an id names the
same bytes on every broker forever. Every broker mirrors the prefix (the retention view's watch) into the
process's `core.zdict.REGISTRY`, so replicas, a topic's next owner and readers of the durable tier can
decompress what any broker compressed. A topic whose policy (its own or its namespace's) asks for a
dictionary samples its first plain records, trains one off the publish path, stores it and records its id
(broker/compression_naming.py); until then (and whenever the store cannot be reached) its records are
compressed with plain zstd.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import msgspec

from ister.broker.compression_naming import name_dictionary
from ister.core import zdict
from ister.core.compression import MARK
from ister.errors import InvalidArgument, MetadataError
from ister.ids import TopicName
from ister.limits import METADATA_TIMEOUT_SECONDS
from ister.metadata import keys
from ister.metadata.cache import LocalCache
from ister.metadata.store import MetadataStore

log = logging.getLogger(__name__)

SAMPLE_RECORDS = (
    500  # records a dictionary is trained on (16 KiB dictionary: as good as 1,000, docs/benchmarks.md)
)
SAMPLE_MAX_BYTES = 4 * 1024 * 1024  # bound on the sample's memory per topic
SAMPLE_MAX_RECORD = 64 * 1024  # larger records teach a dictionary for small ones little; not sampled
RETRY_SECONDS = 10.0  # after a failed training or store, the next attempt waits this long


def dictionary_value(data: bytes, topic: str) -> dict[str, Any]:
    return {"dictionary": base64.b64encode(data).decode(), "topic": topic, "size": len(data)}


def dictionary_bytes(value: Any) -> bytes | None:
    """The dictionary of a stored value (None when it is not one)."""
    encoded = value.get("dictionary") if isinstance(value, dict) else None
    if not isinstance(encoded, str):
        return None
    try:
        return base64.b64decode(encoded, validate=True)
    except ValueError:
        return None


async def store_dictionary(store: MetadataStore, data: bytes, topic: str) -> bool:
    """Create `/ister/compression-dicts/{id}` unless it exists; True when it now holds these bytes, False
    when its id already names another dictionary (train again with another id)."""
    key = keys.compression_dict(zdict.load_id(data))
    async with asyncio.timeout(METADATA_TIMEOUT_SECONDS):
        if await store.compare_and_set(key, dictionary_value(data, topic), expected_version=None):
            return True
        kv = await store.get(key)
    return kv is not None and dictionary_bytes(kv.value) == data


class DictionaryFollower:
    """Loads every stored dictionary into a registry: all at start (the cache's listing), then each new one
    as the cache's watch brings it. A value that is no dictionary is logged and skipped, never fatal."""

    def __init__(self, cache: LocalCache, registry: zdict.DictionaryRegistry = zdict.REGISTRY) -> None:
        self._cache = cache
        self._registry = registry
        self._feed = cache.feed(keys.COMPRESSION_DICTS_PREFIX)

    def sync(self) -> None:
        reset, changed = self._feed.drain()
        if reset:
            changed = {kv.key for kv in self._cache.list(keys.COMPRESSION_DICTS_PREFIX)}
        for key in sorted(changed):
            kv = self._cache.get(key)
            if kv is None:
                continue  # dictionaries are never deleted by Ister; one loaded stays usable
            data = dictionary_bytes(kv.value)
            try:
                if data is None:
                    raise zdict.DictionaryError("not a stored dictionary")
                if key != keys.compression_dict(zdict.load_id(data)):
                    raise zdict.DictionaryError("stored under another id than its own")
                self._registry.add(data)
            except zdict.DictionaryError as exc:
                log.error("compression dictionary %s is unusable: %s", key, exc)

    async def follow(self) -> None:
        while True:
            changed = self._cache.change_event()
            self.sync()
            await changed.wait()


class DictionaryTrainer:
    """One topic's dictionary in the making: a bounded sample of its plain records (taken on the publish
    path: a reference each, nothing computed), then training in a thread and storing, in a task."""

    def __init__(
        self,
        store: MetadataStore,
        name: TopicName,
        spawn: Callable[[Coroutine[Any, Any, None]], None],
        registry: zdict.DictionaryRegistry = zdict.REGISTRY,
        samples: int = SAMPLE_RECORDS,
    ) -> None:
        self._store = store
        self._name = name
        self._spawn = spawn
        self._registry = registry
        self._want = samples
        self._samples: list[bytes] = []
        self._bytes = 0
        self._busy = False
        self._not_before = 0.0
        self._stored: int | None = None  # stored, not named yet (the metadata store failed meanwhile)

    def offer(self, records: Sequence[bytes | msgspec.Raw]) -> None:
        if self._busy or time.monotonic() < self._not_before:
            return
        for r in records:
            if len(self._samples) >= self._want or self._bytes >= SAMPLE_MAX_BYTES:
                break
            view = r if isinstance(r, bytes) else memoryview(r)
            if len(view) and view[0] != MARK and len(view) <= SAMPLE_MAX_RECORD:
                self._samples.append(bytes(view))
                self._bytes += len(view)
        if len(self._samples) >= self._want or self._bytes >= SAMPLE_MAX_BYTES:
            self._busy = True
            self._spawn(self._make(list(self._samples)))

    async def _make(self, samples: list[bytes]) -> None:
        try:
            dict_id = await self.make(samples)
            log.info("%s: trained zstd dictionary %d on %d records", self._name, dict_id, len(samples))
            self._samples, self._bytes = [], 0
        except (MetadataError, TimeoutError, InvalidArgument) as exc:
            log.warning(
                "%s: no compression dictionary yet (%s); records stay plain zstd, retrying in %g s",
                self._name,
                exc,
                RETRY_SECONDS,
            )
            self._not_before = time.monotonic() + RETRY_SECONDS
        finally:
            self._busy = False

    async def make(self, samples: list[bytes]) -> int:
        """Train, store (create-if-absent), load it here, and name it where the topic's policy in effect
        asks for a dictionary (broker/compression_naming.py); the dictionary's id. A dictionary stored
        whose naming failed is named on the next attempt, not trained again."""
        dict_id = self._stored
        if dict_id is None:
            for _ in range(3):  # a random id that names another dictionary already: another id
                data = await asyncio.to_thread(zdict.train, samples, zdict.new_id())
                if await store_dictionary(self._store, data, self._name.full):
                    break
            else:
                raise InvalidArgument("three dictionary ids in a row were taken")
            dict_id = self._stored = self._registry.add(data)
        await name_dictionary(self._store, self._name, dict_id)  # None: the policy changed meanwhile
        self._stored = None
        return dict_id
