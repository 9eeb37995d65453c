"""The compression a topic's records are stored with when their producer sent them plain
(docs/compression.md): the topic's own (`/ister/compression/{ns}/{topic}`), else its namespace policy's
`compression`, else none. Mirrored by a watch (`LocalCache`), so a change applies to the next publish and
a publish reads no metadata."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import msgspec

from ister.core.compression import MARK, Codec, parse_codec, wrap, wrap_with_dictionary
from ister.core.zdict import REGISTRY
from ister.ids import TopicName
from ister.metadata import keys
from ister.metadata.cache import LocalCache
from ister.metadata.records import NamespacePolicy, TopicCompression

if TYPE_CHECKING:
    from ister.broker.compression_dicts import DictionaryTrainer


def compression_in_effect(policy: NamespacePolicy, own: TopicCompression | None) -> tuple[str, str]:
    """(codec name, where it comes from: "topic", "namespace" or "default")."""
    if own is not None:
        return own.compression, "topic"
    if policy.compression is not None:
        return policy.compression, "namespace"
    return "none", "default"


class TopicCompressionPolicy:
    """One loaded topic's codec (and zstd dictionary); looked up again only when its records change."""

    __slots__ = ("_cache", "_codec", "_dict_id", "_ns_key", "_own_key", "_seen", "_wants_dict", "trainer")

    def __init__(self, cache: LocalCache, name: TopicName, trainer: DictionaryTrainer | None = None) -> None:
        self._cache = cache
        self._ns_key = keys.namespace_policy(name.namespace)
        self._own_key = keys.topic_compression(name)
        self._seen: tuple[object, object] = (False, False)
        self._codec = Codec.NONE
        self._dict_id = 0  # the topic's dictionary (its policy names it), 0: none
        self._wants_dict = False  # its policy asks for a dictionary not trained yet
        self.trainer = trainer  # trains it (broker/compression_dicts.py); None: never

    def codec(self) -> Codec:
        ns, own = self._cache.get(self._ns_key), self._cache.get(self._own_key)
        if self._seen[0] is not ns or self._seen[1] is not own:
            policy = NamespacePolicy.lenient(ns.value if ns is not None else None)
            mine = TopicCompression.lenient(own.value) if own is not None else None
            self._codec = parse_codec(compression_in_effect(policy, mine)[0])
            with_dict = mine is not None and mine.dictionary
            self._dict_id = (mine.dictionary_id or 0) if mine is not None and with_dict else 0
            self._wants_dict = with_dict and not self._dict_id
            self._seen = (ns, own)
        return self._codec

    def dictionary(self) -> int:
        """The zstd dictionary producers may compress with (PublishOpened.dictionary_id): the one the
        policy names, when it is zstd and this broker holds it (else 0: the broker would refuse it)."""
        codec = self.codec()
        return self._dict_id if codec is Codec.ZSTD and self._dict_id in REGISTRY else 0

    def sample(self, plain: Sequence[bytes | msgspec.Raw]) -> None:
        """A producer's compressed records, decompressed: samples for a dictionary still to be trained (a
        topic whose producers all compress would otherwise never get one)."""
        self.codec()
        if self._wants_dict and self.trainer is not None:
            self.trainer.offer(plain)

    def stored_form(self, records: Sequence[bytes | msgspec.Raw]) -> Sequence[bytes | msgspec.Raw]:
        """`records` as the WAL stores them under this policy (the same object when it compresses none)."""
        codec = self.codec()
        if codec is Codec.NONE:
            return records
        if self._dict_id and self._dict_id in REGISTRY:  # not loaded (metadata unreachable): plain zstd
            return compress_plain_with_dictionary(self._dict_id, records)
        if self._wants_dict and self.trainer is not None:
            self.trainer.offer(records)
        return compress_plain(codec, records)


def compress_plain(codec: Codec, records: Sequence[bytes | msgspec.Raw]) -> list[bytes | msgspec.Raw]:
    """`records` with each plain one stored compressed with `codec`; a producer's compressed ones stay as
    they came (the producer's choice wins)."""
    out: list[bytes | msgspec.Raw] = []
    for r in records:
        view = r if isinstance(r, bytes) else memoryview(r)
        out.append(r if len(view) and view[0] == MARK else wrap(codec, view))
    return out


def compress_plain_with_dictionary(
    dict_id: int, records: Sequence[bytes | msgspec.Raw]
) -> list[bytes | msgspec.Raw]:
    """As `compress_plain`, with zstd and the dictionary `dict_id` (loaded in core.zdict.REGISTRY)."""
    out: list[bytes | msgspec.Raw] = []
    for r in records:
        view = r if isinstance(r, bytes) else memoryview(r)
        out.append(r if len(view) and view[0] == MARK else wrap_with_dictionary(dict_id, view))
    return out
