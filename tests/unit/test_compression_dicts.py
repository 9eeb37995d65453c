"""Trained zstd dictionaries in the metadata store (ister.broker.compression_dicts): stored immutable, loaded
by every broker from its cache, trained from a topic's first records; metadata failures leave records
plain zstd and nothing lost."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ister.benchmark.payloads import log_lines
from ister.broker.compression_dicts import (
    DictionaryFollower,
    DictionaryTrainer,
    dictionary_bytes,
    dictionary_value,
    store_dictionary,
)
from ister.broker.compression_policy import TopicCompressionPolicy
from ister.core import zdict
from ister.core.compression import ENVELOPE_SIZE, plain, uses_dictionary
from ister.errors import MetadataError
from ister.ids import TopicName
from ister.metadata import keys
from ister.metadata.cache import LocalCache
from ister.metadata.embedded import EmbeddedStore
from ister.metadata.records import TopicCompression

TOPIC = TopicName.parse("/default/logs")
SAMPLES = log_lines(200)


@pytest.fixture(scope="module")
def trained() -> bytes:
    return zdict.train(SAMPLES, 777_777)


class Down(EmbeddedStore):
    """The metadata store unreachable for writes and reads of keys (as etcd down: MetadataError)."""

    down = False

    async def compare_and_set(self, key: str, value: Any, **kw: Any) -> bool:
        if self.down:
            raise MetadataError("metadata store unreachable")
        return await super().compare_and_set(key, value, **kw)

    async def get(self, key: str) -> Any:
        if self.down:
            raise MetadataError("metadata store unreachable")
        return await super().get(key)


def down_store() -> Down:
    plain_store = EmbeddedStore.in_memory()
    plain_store.__class__ = Down
    return plain_store  # type: ignore[return-value]


async def test_a_dictionary_is_created_once_and_never_replaced(trained: bytes) -> None:
    store = EmbeddedStore.in_memory()
    assert await store_dictionary(store, trained, TOPIC.full)
    assert await store_dictionary(store, trained, TOPIC.full)  # the same bytes again: fine
    other = zdict.train(log_lines(200, seed=5), 777_777)  # the same id, other bytes
    assert not await store_dictionary(store, other, TOPIC.full)
    kv = await store.get(keys.compression_dict(777_777))
    assert kv is not None and dictionary_bytes(kv.value) == trained and kv.value["topic"] == "/default/logs"


async def test_storing_with_the_metadata_store_down_fails_clearly(trained: bytes) -> None:
    store = down_store()
    store.down = True
    with pytest.raises(MetadataError):
        await store_dictionary(store, trained, TOPIC.full)


async def test_the_follower_loads_stored_dictionaries_at_start_and_as_they_come(trained: bytes) -> None:
    store = EmbeddedStore.in_memory()
    await store.put(keys.compression_dict(5), {"dictionary": "not base64!"})  # bad values: skipped
    await store.put(keys.compression_dict(6), dictionary_value(trained, "/x/y"))  # under another id
    cache = LocalCache(store, [keys.COMPRESSION_DICTS_PREFIX])
    registry = zdict.DictionaryRegistry()
    follower = DictionaryFollower(cache, registry)
    await cache.start()
    try:
        follower.sync()
        assert registry.ids() == []
        task = asyncio.create_task(follower.follow())
        await store_dictionary(store, trained, TOPIC.full)
        assert await cache.wait_for(lambda: 777_777 in registry, 5.0)
        task.cancel()
    finally:
        await cache.close()


def records(n: int, seed: int = 1) -> list[bytes]:
    from ister.core.record import StoredMessage, encode_message

    return [
        encode_message(
            StoredMessage(payload=p, publish_time=1_765_000_000_000 + i, producer_id=1, producer_name="p")
        )
        for i, p in enumerate(log_lines(n, seed=seed))
    ]


async def policy_with(store: EmbeddedStore, spawned: list[Any], samples: int = 100) -> tuple[Any, Any]:
    await store.put(keys.topic_compression(TOPIC), {"compression": "zstd", "dictionary": True})
    cache = LocalCache(store, [keys.COMPRESSION_PREFIX, keys.COMPRESSION_DICTS_PREFIX, "/namespaces/"])
    await cache.start()
    registry = zdict.REGISTRY
    trainer = DictionaryTrainer(store, TOPIC, spawned.append, registry, samples=samples)
    return cache, TopicCompressionPolicy(cache, TOPIC, trainer)


async def test_a_topic_trains_on_its_first_records_then_uses_its_dictionary() -> None:
    store = EmbeddedStore.in_memory()
    spawned: list[Any] = []
    cache, policy = await policy_with(store, spawned)
    try:
        first = policy.stored_form(records(60))
        assert not any(uses_dictionary(r) for r in first) and not spawned  # plain zstd while sampling
        policy.stored_form(records(60, seed=2))
        assert len(spawned) == 1  # 100 samples: training starts once, off the publish path
        policy.stored_form(records(10, seed=3))
        assert len(spawned) == 1
        await spawned[0]
        kv = await store.get(keys.topic_compression(TOPIC))
        own = TopicCompression.lenient(kv.value if kv else None)
        assert own is not None and own.dictionary_id is not None
        assert await cache.wait_for(
            lambda: (
                policy.stored_form(records(1))[0] is not None
                and uses_dictionary(policy.stored_form(records(1))[0])
            ),
            5.0,
        )
        later = records(50, seed=4)
        stored = policy.stored_form(later)
        assert all(uses_dictionary(r) for r in stored)
        assert [plain(r) for r in stored] == later
        assert zdict.dict_id_of(stored[0][ENVELOPE_SIZE:]) == own.dictionary_id
        assert sum(map(len, stored)) * 2.5 < sum(map(len, later))
    finally:
        await cache.close()


async def test_metadata_down_while_storing_keeps_plain_zstd_and_retries_later(monkeypatch: Any) -> None:
    store = down_store()
    spawned: list[Any] = []
    cache, policy = await policy_with(store, spawned)
    try:
        store.down = True
        policy.stored_form(records(120))
        await spawned[0]  # training failed to store: logged, not raised
        stored = policy.stored_form(records(120, seed=2))
        assert not any(uses_dictionary(r) for r in stored)
        assert len(spawned) == 1  # no new attempt before the retry delay
        monkeypatch.setattr("ister.broker.compression_dicts.RETRY_SECONDS", 0.0)
        trainer = policy.trainer
        assert trainer is not None
        trainer._not_before = 0.0
        store.down = False
        policy.stored_form(records(1, seed=3))
        assert len(spawned) == 2
        await spawned[1]
        kv = await store.get(keys.topic_compression(TOPIC))
        assert kv is not None and kv.value.get("dictionary_id")
    finally:
        await cache.close()


async def test_a_dictionary_named_but_not_loaded_compresses_plain_zstd() -> None:
    store = EmbeddedStore.in_memory()
    await store.put(
        keys.topic_compression(TOPIC), {"compression": "zstd", "dictionary": True, "dictionary_id": 424242}
    )
    cache = LocalCache(store, [keys.COMPRESSION_PREFIX, "/namespaces/"])
    await cache.start()
    try:
        policy = TopicCompressionPolicy(cache, TOPIC, None)
        stored = policy.stored_form(records(5))
        assert not any(uses_dictionary(r) for r in stored) and stored[0][1] == 4  # zstd
    finally:
        await cache.close()


def test_ister_clients_get_records_with_a_dictionary_plain(trained: bytes) -> None:
    from crc32c import crc32c

    from ister.core.compression import Codec, wrap, wrap_with_dictionary
    from ister.core.frames import HEADER
    from ister.server.ister_compressed import client_frames, client_record

    zdict.REGISTRY.add(trained)
    plain_r, zstd_r = records(2)
    with_dict = wrap_with_dictionary(777_777, plain_r)
    by_zstd = wrap(Codec.ZSTD, zstd_r)
    assert client_record(by_zstd, True) is by_zstd and client_record(with_dict, True) == plain_r
    assert client_record(by_zstd, False) == zstd_r
    frames = b"".join(HEADER.pack(i, len(r), crc32c(r)) + r for i, r in enumerate([by_zstd, with_dict]))
    out = bytes(client_frames(frames, True))
    expected = b"".join(HEADER.pack(i, len(r), crc32c(r)) + r for i, r in enumerate([by_zstd, plain_r]))
    assert out == expected
    only_zstd = HEADER.pack(0, len(by_zstd), crc32c(by_zstd)) + by_zstd
    assert client_frames(only_zstd, True) is only_zstd  # nothing to replace: no copy


async def test_the_admin_asks_for_zstd_and_keeps_a_trained_dictionary() -> None:
    from ister.broker.compression_admin import CompressionAdmin
    from ister.errors import InvalidArgument

    store = EmbeddedStore.in_memory()
    await store.put(keys.namespace_policy("default"), {})

    async def resolve(raw: str) -> tuple[TopicName, list[TopicName]]:
        return TOPIC, [TOPIC]

    admin = CompressionAdmin(store, resolve)
    with pytest.raises(InvalidArgument, match="needs zstd"):
        await admin.set_topic("/default/logs", "lz4", False, True)
    got = await admin.set_topic("/default/logs", "zstd", False, True)
    assert got == ("zstd", "topic", True, 0)
    await store.put(
        keys.topic_compression(TOPIC), {"compression": "zstd", "dictionary": True, "dictionary_id": 99_999}
    )
    assert await admin.set_topic("/default/logs", "zstd", False, True) == ("zstd", "topic", True, 99_999)
    assert await admin.set_topic("/default/logs", "zstd", False) == ("zstd", "topic", False, 0)
    kv = await store.get(keys.topic_compression(TOPIC))
    assert kv is not None and kv.value == {"compression": "zstd"}  # the record as before dictionaries
