"""The compression a topic's records are stored with when their producer sent them plain
(docs/compression.md): the topic's own (`/ister/compression/{ns}/{topic}`), else its namespace policy's
`compression`, else none. Mirrored by a watch (`LocalCache`), so a change applies to the next publish and
a publish reads no metadata."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from ister.core.compression import MARK, Codec, parse_codec, wrap
from ister.ids import TopicName
from ister.metadata import keys
from ister.metadata.cache import LocalCache
from ister.metadata.records import NamespacePolicy, TopicCompression


def compression_in_effect(policy: NamespacePolicy, own: TopicCompression | None) -> tuple[str, str]:
    """(codec name, where it comes from: "topic", "namespace" or "default")."""
    if own is not None:
        return own.compression, "topic"
    if policy.compression is not None:
        return policy.compression, "namespace"
    return "none", "default"


class TopicCompressionPolicy:
    """One loaded topic's codec; looked up again only when its records change."""

    __slots__ = ("_cache", "_codec", "_ns_key", "_own_key", "_seen")

    def __init__(self, cache: LocalCache, name: TopicName) -> None:
        self._cache = cache
        self._ns_key = keys.namespace_policy(name.namespace)
        self._own_key = keys.topic_compression(name)
        self._seen: tuple[object, object] = (False, False)
        self._codec = Codec.NONE

    def codec(self) -> Codec:
        ns, own = self._cache.get(self._ns_key), self._cache.get(self._own_key)
        if self._seen[0] is not ns or self._seen[1] is not own:
            policy = NamespacePolicy.lenient(ns.value if ns is not None else None)
            mine = TopicCompression.lenient(own.value) if own is not None else None
            self._codec = parse_codec(compression_in_effect(policy, mine)[0])
            self._seen = (ns, own)
        return self._codec


def compress_plain(codec: Codec, records: Sequence[bytes | msgspec.Raw]) -> list[bytes | msgspec.Raw]:
    """`records` with each plain one stored compressed with `codec`; a producer's compressed ones stay as
    they came (the producer's choice wins)."""
    out: list[bytes | msgspec.Raw] = []
    for r in records:
        view = r if isinstance(r, bytes) else memoryview(r)
        out.append(r if len(view) and view[0] == MARK else wrap(codec, view))
    return out
