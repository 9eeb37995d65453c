"""Admin of compression policies (docs/compression.md): a namespace's `compression` (a field of its policy,
by compare-and-set, its other fields kept) and a topic's own (`/ister/compression/{ns}/{topic}`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from ister.broker.compression_policy import compression_in_effect
from ister.core.compression import NAMES, parse_codec
from ister.errors import InvalidArgument, NotFound
from ister.ids import TopicName, shown, validate_segment
from ister.metadata import keys
from ister.metadata import topic_catalog as catalog
from ister.metadata.records import NamespacePolicy, TopicCompression
from ister.metadata.store import MetadataStore


class CompressionAdmin:
    def __init__(
        self, store: MetadataStore, resolve: Callable[[str], Awaitable[tuple[TopicName, list[TopicName]]]]
    ) -> None:
        self.store = store
        self._resolve = resolve  # (name, its topics: itself or its partitions), NotFound when neither

    async def set_namespace(self, ns: str, codec: str) -> tuple[str, str]:
        """`none` stores none explicitly: the namespace's topics store plain records unless they say."""
        validate_segment(ns, "namespace")
        name = NAMES[parse_codec(codec)]

        def change(value: dict[str, Any]) -> dict[str, Any]:
            value["compression"] = name
            return value

        await catalog.update_namespace_policy(self.store, ns, change)
        return await self.get_namespace(ns)

    async def get_namespace(self, ns: str) -> tuple[str, str]:
        validate_segment(ns, "namespace")
        return compression_in_effect(await self._policy(ns), None)

    async def _policy(self, ns: str) -> NamespacePolicy:
        kv = await self.store.get(keys.namespace_policy(ns))
        if kv is None:
            raise NotFound(f"namespace {shown(ns)} does not exist")
        return NamespacePolicy.lenient(kv.value)

    async def set_topic(self, raw: str, codec: str, clear: bool) -> tuple[str, str]:
        """Every partition of a partitioned topic gets the same codec; `clear`: its namespace's applies."""
        if clear == bool(codec):
            raise InvalidArgument("give either a compression or clear, not both or neither")
        _, targets = await self._resolve(raw)
        for name in targets:
            key = keys.topic_compression(name)
            if clear:
                await self.store.delete(key)
            else:
                await self.store.put(key, TopicCompression(compression=NAMES[parse_codec(codec)]).to_json())
        return await self.get_topic(raw)

    async def get_topic(self, raw: str) -> tuple[str, str]:
        _, targets = await self._resolve(raw)
        name = targets[0]
        kv = await self.store.get(keys.topic_compression(name))
        own = TopicCompression.lenient(kv.value) if kv is not None else None
        return compression_in_effect(await self._policy(name.namespace), own)
