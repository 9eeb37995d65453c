"""Admin of compression policies (docs/compression.md): a namespace's `compression` and
`compression_dictionary` (fields of its policy, by compare-and-set, its other fields kept) and a topic's own
(`/ister/compression/{ns}/{topic}`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

from ister.broker.compression_policy import compression_in_effect, dictionary_in_effect
from ister.core.compression import NAMES, parse_codec
from ister.errors import FailedPrecondition, InvalidArgument, NotFound
from ister.ids import TopicName, shown, validate_segment
from ister.metadata import keys
from ister.metadata import topic_catalog as catalog
from ister.metadata.records import NamespacePolicy, TopicCompression, namespace_dict_id
from ister.metadata.store import MetadataStore


class InEffect(NamedTuple):
    compression: str
    source: str  # "topic", "namespace" or "default"
    dictionary: bool = False  # zstd with a dictionary trained per topic (docs/compression.md)
    dictionary_id: int = 0  # a topic's, once trained; 0 while its first records are sampled (and namespaces)


class CompressionAdmin:
    def __init__(
        self,
        store: MetadataStore,
        resolve: Callable[[str], Awaitable[tuple[TopicName, list[TopicName]]]],
        reliable: Callable[[TopicName], Awaitable[bool]] | None = None,
    ) -> None:
        self.store = store
        self._resolve = resolve  # (name, its topics: itself or its partitions), NotFound when neither
        self._reliable = reliable  # None: every topic taken as reliable

    async def set_namespace(
        self, ns: str, codec: str, dictionary: bool = False, clear: bool = False
    ) -> InEffect:
        """`none` stores none explicitly: the namespace's topics store plain records unless they say;
        `clear` drops the field (none too). `dictionary` (zstd only): each of its topics without a policy of
        its own trains its own dictionary on its first records. Anything but `zstd` with `dictionary`
        forgets the dictionaries its topics trained for it, so asking again trains new ones."""
        validate_segment(ns, "namespace")
        if clear == bool(codec):
            raise InvalidArgument("give either a compression or clear, not both or neither")
        name = NAMES[parse_codec(codec)] if codec else ""
        if dictionary and name != "zstd":
            raise InvalidArgument("a compression dictionary needs zstd")

        def change(value: dict[str, Any]) -> dict[str, Any]:
            value.pop("compression", None)
            value.pop("compression_dictionary", None)
            if name:
                value["compression"] = name
            if dictionary:
                value["compression_dictionary"] = True
            return value

        await catalog.update_namespace_policy(self.store, ns, change)
        if not dictionary:  # after the policy: a publish stops using them from the next one on already
            await self.store.delete_prefix(keys.namespace_dicts_prefix(ns))
        return await self.get_namespace(ns)

    async def get_namespace(self, ns: str) -> InEffect:
        validate_segment(ns, "namespace")
        policy = await self._policy(ns)
        return InEffect(*compression_in_effect(policy, None), policy.compression_dictionary)

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
        shown_name, targets = await self._resolve(raw)
        if codec and self._reliable is not None and not await self._reliable(targets[0]):
            # accepted, it would do nothing: the policy compresses what a topic stores
            raise FailedPrecondition(
                f"{shown_name} is NonReliable: it stores nothing, so a codec of its own compresses nothing "
                "(a producer's own codec still compresses what it sends)"
            )
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
        policy = await self._policy(name.namespace)
        trained = await self.store.get(keys.topic_namespace_dict(name)) if own is None else None
        trained_id = namespace_dict_id(trained.value) if trained is not None else None
        return InEffect(*compression_in_effect(policy, own), *dictionary_in_effect(policy, own, trained_id))
