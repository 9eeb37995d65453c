"""The compression a topic's records are stored with when their producer sent them plain
(docs/compression.md): the topic's own (`/ister/compression/{ns}/{topic}`), else its namespace policy's
`compression`, else none; with zstd, the dictionary the policy in effect asks for (the topic's own record
names it, or, under a namespace policy, `/ister/compression-namespace-dict/{ns}/{topic}`). Mirrored by a
watch (`LocalCache`), so a change applies to the next publish and a publish reads no metadata."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import msgspec

from ister.core.compression import MARK, Codec, parse_codec, wrap, wrap_with_dictionary
from ister.core.zdict import REGISTRY
from ister.ids import TopicName
from ister.metadata import keys
from ister.metadata.cache import LocalCache
from ister.metadata.records import NamespacePolicy, TopicCompression, namespace_dict_id

if TYPE_CHECKING:
    from ister.broker.compression_dicts import DictionaryTrainer


def compression_in_effect(policy: NamespacePolicy, own: TopicCompression | None) -> tuple[str, str]:
    """(codec name, where it comes from: "topic", "namespace" or "default")."""
    if own is not None:
        return own.compression, "topic"
    if policy.compression is not None:
        return policy.compression, "namespace"
    return "none", "default"


def dictionary_in_effect(
    policy: NamespacePolicy, own: TopicCompression | None, trained: int | None
) -> tuple[bool, int]:
    """(the policy in effect asks for a zstd dictionary, its id or 0 while none is trained). A topic's own
    policy names its own; under its namespace's, `trained` is the one the topic trained for it (its
    `/ister/compression-namespace-dict/` record), used only while the namespace still asks for one."""
    if own is not None:
        return own.dictionary, (own.dictionary_id or 0) if own.dictionary else 0
    if policy.compression_dictionary:  # lenient: only with zstd
        return True, trained or 0
    return False, 0


class TopicCompressionPolicy:
    """One loaded topic's codec (and zstd dictionary); looked up again only when its records change."""

    __slots__ = (
        "_cache",
        "_codec",
        "_dict_id",
        "_ns_key",
        "_own_key",
        "_seen",
        "_trained_key",
        "_wants_dict",
        "trainer",
    )

    def __init__(self, cache: LocalCache, name: TopicName, trainer: DictionaryTrainer | None = None) -> None:
        self._cache = cache
        self._ns_key = keys.namespace_policy(name.namespace)
        self._own_key = keys.topic_compression(name)
        self._trained_key = keys.topic_namespace_dict(name)
        self._seen: tuple[object, object, object] = (False, False, False)
        self._codec = Codec.NONE
        self._dict_id = 0  # the topic's dictionary (its policy names it), 0: none
        self._wants_dict = False  # its policy asks for a dictionary not trained yet
        self.trainer = trainer  # trains it (broker/compression_dicts.py); None: never

    def codec(self) -> Codec:
        cache = self._cache
        ns, own, trained = cache.get(self._ns_key), cache.get(self._own_key), cache.get(self._trained_key)
        if self._seen[0] is not ns or self._seen[1] is not own or self._seen[2] is not trained:
            policy = NamespacePolicy.lenient(ns.value if ns is not None else None)
            mine = TopicCompression.lenient(own.value) if own is not None else None
            self._codec = parse_codec(compression_in_effect(policy, mine)[0])
            trained_id = namespace_dict_id(trained.value) if trained is not None else None
            with_dict, self._dict_id = dictionary_in_effect(policy, mine, trained_id)
            self._wants_dict = with_dict and not self._dict_id
            self._seen = (ns, own, trained)
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
