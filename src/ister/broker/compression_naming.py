"""Where a topic records the zstd dictionary it trained (docs/compression.md, "Dictionaries"): in its own
policy record (`dictionary_id`) when that asks for one, else, when its namespace policy asks for one, in
`/ister/compression-namespace-dict/{ns}/{topic}`. Written once, off the publish path, by the topic's owner;
what a publish uses is decided again from the mirrored records (broker/compression_policy.py), so a record
written just after the admin changed a policy is never used against that change."""

from __future__ import annotations

import asyncio

from ister.ids import TopicName
from ister.limits import METADATA_TIMEOUT_SECONDS
from ister.metadata import keys
from ister.metadata.records import NamespacePolicy, TopicCompression
from ister.metadata.store import MetadataStore


async def name_dictionary(store: MetadataStore, name: TopicName, dict_id: int) -> str | None:
    """Record `dict_id` as `name`'s dictionary where its policy in effect asks for one and names none yet:
    "topic" or "namespace" (where it was recorded), None when no policy asks for it any more or another
    write won (the dictionary stays stored, unused). Raises MetadataError or TimeoutError when the store
    cannot be reached (the caller retries)."""
    own_key = keys.topic_compression(name)
    async with asyncio.timeout(METADATA_TIMEOUT_SECONDS):
        kv = await store.get(own_key)
        if kv is not None:  # the topic's own policy wins over its namespace's
            own = TopicCompression.lenient(kv.value)
            if own is None or not own.dictionary or own.dictionary_id is not None:
                return None
            named = TopicCompression(compression=own.compression, dictionary=True, dictionary_id=dict_id)
            # compare-and-set on the record read: an admin change meanwhile wins
            done = await store.compare_and_set(own_key, named.to_json(), expected_version=kv.version)
            return "topic" if done else None
        ns = await store.get(keys.namespace_policy(name.namespace))
        if not NamespacePolicy.lenient(ns.value if ns is not None else None).compression_dictionary:
            return None
        # created only if absent: a dictionary the topic already has for its namespace policy stays
        trained = {"dictionary_id": dict_id}
        done = await store.compare_and_set(keys.topic_namespace_dict(name), trained, expected_version=None)
        return "namespace" if done else None
