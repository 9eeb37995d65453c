"""Admin of compression policies (docs/compression.md): a namespace's `compression` (a field of its policy,
by compare-and-set, its other fields kept) and a topic's own (`/ister/compression/{ns}/{topic}`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

from ister.broker.compression_policy import compression_in_effect
from ister.core.compression import NAMES, parse_codec
from ister.errors import InvalidArgument, NotFound
from ister.ids import TopicName, shown, validate_segment
from ister.metadata import keys
from ister.metadata import topic_catalog as catalog
from ister.metadata.records import NamespacePolicy, TopicCompression
from ister.metadata.store import MetadataStore


class InEffect(NamedTuple):
    compression: str
    source: str  # "topic", "namespace" or "default"
    dictionary: bool = False  # a topic's own zstd with a trained dictionary (docs/compression.md)
    dictionary_id: int = 0  # its id once trained; 0 while the topic's first records are sampled


class CompressionAdmin:
    def __init__(
        self, store: MetadataStore, resolve: Callable[[str], Awaitable[tuple[TopicName, list[TopicName]]]]
    ) -> None:
        self.store = store
        self._resolve = resolve  # (name, its topics: itself or its partitions), NotFound when neither

    async def set_namespace(self, ns: str, codec: str) -> InEffect:
        """`none` stores none explicitly: the namespace's topics store plain records unless they say."""
        validate_segment(ns, "namespace")
        name = NAMES[parse_codec(codec)]

        def change(value: dict[str, Any]) -> dict[str, Any]:
            value["compression"] = name
            return value

        await catalog.update_namespace_policy(self.store, ns, change)
        return await self.get_namespace(ns)

    async def get_namespace(self, ns: str) -> InEffect:
        validate_segment(ns, "namespace")
        return InEffect(*compression_in_effect(await self._policy(ns), None))

    async def _policy(self, ns: str) -> NamespacePolicy:
        kv = await self.store.get(keys.namespace_policy(ns))
        if kv is None:
            raise NotFound(f"namespace {shown(ns)} does not exist")
        return NamespacePolicy.lenient(kv.value)

    async def set_topic(self, raw: str, codec: str, clear: bool, dictionary: bool = False) -> InEffect:
        """Every partition of a partitioned topic gets the same codec; `clear`: its namespace's applies.
        `dictionary` (zstd only): each partition's owner trains a dictionary on its first records; a
        partition that has one already keeps it (dictionaries are immutable)."""
        if clear == bool(codec):
            raise InvalidArgument("give either a compression or clear, not both or neither")
        name_of = NAMES[parse_codec(codec)] if codec else ""
        if dictionary and name_of != "zstd":
            raise InvalidArgument("a compression dictionary needs zstd")
        _, targets = await self._resolve(raw)
        for name in targets:
            key = keys.topic_compression(name)
            if clear:
                await self.store.delete(key)
                continue
            kept = None
            if dictionary:
                kv = await self.store.get(key)
                old = TopicCompression.lenient(kv.value) if kv is not None else None
                kept = old.dictionary_id if old is not None else None
            record = TopicCompression(compression=name_of, dictionary=dictionary, dictionary_id=kept)
            await self.store.put(key, record.to_json())
        return await self.get_topic(raw)

    async def get_topic(self, raw: str) -> InEffect:
        _, targets = await self._resolve(raw)
        name = targets[0]
        kv = await self.store.get(keys.topic_compression(name))
        own = TopicCompression.lenient(kv.value) if kv is not None else None
        codec, source = compression_in_effect(await self._policy(name.namespace), own)
        if own is None or not own.dictionary:
            return InEffect(codec, source)
        return InEffect(codec, source, True, own.dictionary_id or 0)
