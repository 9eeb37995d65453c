"""zstd dictionaries on the batch API's wire (docs/compression.md, "Dictionaries"): the broker's
GetCompressionDictionary and its auth rule, records as stored for clients that accept dictionaries (plain
for older ones), the client's fetch on demand and its failures, producers compressing with a dictionary,
and a batch naming a dictionary the broker does not hold."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import msgspec
import pytest
from crc32c import crc32c

from ister import errors
from ister.benchmark.payloads import log_lines
from ister.broker.compression_dicts import DictionaryTrainer, dictionary_value
from ister.broker.compression_policy import TopicCompressionPolicy
from ister.client.dictionaries import Dictionaries
from ister.client.messages import split_frames
from ister.client.publisher import PartitionPublisher
from ister.client.records import Batch
from ister.client.subscriber import Subscriber
from ister.core import zdict
from ister.core.compressed_batch import compress_batch, decompress_batch
from ister.core.compression import (
    Codec,
    CompressionError,
    MissingDictionary,
    dictionary_of,
    uses_dictionary,
    wrap,
    wrap_with_dictionary,
)
from ister.core.frames import HEADER
from ister.core.record import StoredMessage, array_header, encode_message, idem_tag_of, tag_record
from ister.ids import TopicName
from ister.metadata import keys
from ister.metadata.cache import LocalCache
from ister.metadata.embedded import EmbeddedStore
from ister.server.auth_rules import RULES
from ister.server.ister_api import pack_frames
from ister.server.ister_compressed import client_frames, client_record, dictionary_namespace, get_dictionary
from ister.wire.gen import ister_v1_pb2 as pb

# Ids of this module only: the process's registry refuses other bytes under an id it holds.
LOADED, FOREIGN, FETCHED, SUBSCRIBED = 888_001, 888_002, 888_003, 888_004
TOPIC = "/default/logs"


def _records(n: int, seed: int = 1) -> list[bytes]:
    return [
        encode_message(
            StoredMessage(payload=p, publish_time=1_765_000_000_000 + i, producer_id=1, producer_name="p")
        )
        for i, p in enumerate(log_lines(n, seed=seed))
    ]


@pytest.fixture(scope="module")
def samples() -> list[bytes]:
    return _records(200, seed=7)


@pytest.fixture(scope="module")
def loaded(samples: list[bytes]) -> bytes:
    """A dictionary in the process's registry (what a broker holds, what a client has fetched)."""
    data = zdict.train(samples, LOADED)
    zdict.REGISTRY.add(data)
    return data


@pytest.fixture(scope="module")
def foreign(samples: list[bytes]) -> zdict.DictionaryRegistry:
    """A registry with a dictionary the process's registry never gets (one the broker does not hold)."""
    registry = zdict.DictionaryRegistry()
    registry.add(zdict.train(samples, FOREIGN))
    return registry


def _frames(records: list[bytes]) -> bytes:
    return b"".join(HEADER.pack(i, len(r), crc32c(r)) + r for i, r in enumerate(records))


# -- the broker's side -----------------------------------------------------------------------------------


def test_records_go_as_stored_to_clients_that_accept_dictionaries_and_plain_to_older_ones(
    loaded: bytes,
) -> None:
    plain_r, zstd_r = _records(2)
    with_dict = wrap_with_dictionary(LOADED, plain_r)
    by_zstd = wrap(Codec.ZSTD, zstd_r)
    assert client_record(with_dict, True, True) is with_dict
    assert client_record(with_dict, True, False) == plain_r  # a client from before accept_dictionaries
    assert client_record(with_dict, False, True) == plain_r  # without accept_compressed: plain, whatever
    assert client_record(by_zstd, True, True) is by_zstd
    frames = _frames([by_zstd, with_dict])
    assert client_frames(frames, True, True) is frames  # nothing scanned, nothing copied
    assert bytes(client_frames(frames, True, False)) == _frames([by_zstd, plain_r])
    assert bytes(client_frames(frames, False, True)) == _frames([zstd_r, plain_r])
    assert pack_frames([(0, by_zstd), (1, with_dict)], True, True) == frames  # Read
    assert pack_frames([(0, by_zstd), (1, with_dict)], True) == _frames([by_zstd, plain_r])  # flag unset


def test_the_dictionary_namespace_of_a_stored_value() -> None:
    assert dictionary_namespace({"topic": "/default/logs"}) == "default"
    assert dictionary_namespace({"topic": "/sales"}) == "sales"  # a namespace's own dictionary
    assert dictionary_namespace({"topic": "sales"}) == "sales"
    assert dictionary_namespace({"topic": "/"}) is None
    assert dictionary_namespace({}) is None
    assert dictionary_namespace("no dict") is None


async def test_get_dictionary_answers_its_namespace_from_the_registry_and_not_found_otherwise(
    loaded: bytes,
) -> None:
    store = EmbeddedStore.in_memory()
    await store.put(keys.compression_dict(LOADED), dictionary_value(loaded, TOPIC))
    cache = LocalCache(store, [keys.COMPRESSION_DICTS_PREFIX])
    await cache.start()
    registry = zdict.DictionaryRegistry()
    registry.add(loaded)
    try:
        ask = pb.GetCompressionDictionaryRequest
        resp = get_dictionary(ask(id=LOADED, topic="/default/other"), cache, registry)  # any topic of it
        assert resp.id == LOADED and resp.dictionary == loaded
        for request, registry_ in (
            (ask(id=424_242, topic=TOPIC), registry),  # unknown
            (ask(id=LOADED, topic="/elsewhere/logs"), registry),  # another namespace's: not given
            (ask(id=LOADED, topic=TOPIC), zdict.DictionaryRegistry()),  # stored, not loaded here yet
        ):
            with pytest.raises(errors.NotFound, match=f"no zstd dictionary {request.id} for namespace"):
                get_dictionary(request, cache, registry_)
        with pytest.raises(errors.InvalidArgument):
            get_dictionary(ask(id=LOADED, topic="no-slashes"), cache, registry)
    finally:
        await cache.close()


def test_get_dictionary_needs_lookup_on_the_topic() -> None:
    rule = RULES["/ister.v1.Ister/GetCompressionDictionary"]
    assert rule.permission == "Lookup" and not rule.change
    assert str(rule.resource(pb.GetCompressionDictionaryRequest(id=1, topic="/default/logs"))) == (
        "topic:/default/logs"
    )


async def test_the_policy_names_its_dictionary_to_producers_only_when_loaded(loaded: bytes) -> None:
    name = TopicName.parse(TOPIC)
    store = EmbeddedStore.in_memory()
    own = {"compression": "zstd", "dictionary": True, "dictionary_id": LOADED}
    await store.put(keys.topic_compression(name), own)
    cache = LocalCache(store, [keys.COMPRESSION_PREFIX, "/namespaces/"])
    await cache.start()
    try:
        policy = TopicCompressionPolicy(cache, name, None)
        assert policy.dictionary() == LOADED
        await store.put(keys.topic_compression(name), {**own, "dictionary_id": 424_243})  # not loaded
        assert await cache.wait_for(lambda: policy.dictionary() == 0, 5.0)
        await store.put(keys.topic_compression(name), {"compression": "lz4"})
        assert await cache.wait_for(lambda: policy.codec() is Codec.LZ4, 5.0)
        assert policy.dictionary() == 0
    finally:
        await cache.close()


async def test_a_producers_compressed_records_are_samples_for_the_dictionary_to_train() -> None:
    name = TopicName.parse(TOPIC)
    store = EmbeddedStore.in_memory()
    await store.put(keys.topic_compression(name), {"compression": "zstd", "dictionary": True})
    cache = LocalCache(store, [keys.COMPRESSION_PREFIX, "/namespaces/"])
    await cache.start()
    spawned: list[Any] = []
    try:
        trainer = DictionaryTrainer(store, name, spawned.append, zdict.DictionaryRegistry(), samples=100)
        policy = TopicCompressionPolicy(cache, name, trainer)
        stored = [wrap(Codec.ZSTD, r) for r in _records(120)]
        policy.stored_form(stored)
        assert not spawned  # compressed records teach nothing
        policy.sample(_records(120))  # the same records as the broker decompressed them
        assert len(spawned) == 1
        spawned[0].close()  # not run: training is tested in test_compression_dicts.py
    finally:
        await cache.close()


def test_a_batch_with_a_dictionary_the_broker_does_not_hold_is_refused(
    loaded: bytes, foreign: zdict.DictionaryRegistry
) -> None:
    recs = _records(3)
    size = len(array_header(3)) + sum(map(len, recs))
    data = msgspec.msgpack.encode([wrap_with_dictionary(FOREIGN, r, foreign) for r in recs])
    with pytest.raises(CompressionError, match=f"record 0: zstd frame needs dictionary {FOREIGN}"):
        decompress_batch(Codec.ZSTD, data, 3, size, 1 << 20)
    ok, plain_size = compress_batch(Codec.ZSTD, array_header(3) + b"".join(recs), LOADED)
    assert plain_size == size
    plain_array, stored = decompress_batch(Codec.ZSTD, ok, 3, size, 1 << 20)
    assert plain_array == array_header(3) + b"".join(recs)
    assert [dictionary_of(r) for r in stored] == [LOADED] * 3


def test_a_tagged_record_keeps_its_dictionary(loaded: bytes) -> None:
    record = _records(1)[0]
    tagged = tag_record(wrap_with_dictionary(LOADED, record), 5, 10, 3)
    assert dictionary_of(tagged) == LOADED
    assert idem_tag_of(tagged) == (5, 10, 3)
    assert dictionary_of(tag_record(wrap(Codec.ZSTD, record), 5, 10, 3)) == 0


# -- the client's side -----------------------------------------------------------------------------------


def test_a_missing_dictionary_is_its_own_error_and_damage_stays_corruption(
    loaded: bytes, foreign: zdict.DictionaryRegistry
) -> None:
    recs = _records(2)
    frames = _frames([wrap_with_dictionary(LOADED, recs[0]), wrap_with_dictionary(FOREIGN, recs[1], foreign)])
    with pytest.raises(MissingDictionary) as info:
        split_frames(frames, 2)
    assert info.value.dict_id == FOREIGN and isinstance(info.value, CompressionError)
    damaged = bytearray(wrap_with_dictionary(LOADED, recs[0]))
    damaged[len(damaged) // 2] ^= 0xFF
    with pytest.raises(errors.CorruptionError, match="does not decompress"):
        split_frames(_frames([bytes(damaged)]), 1)
    offsets, records = split_frames(_frames([wrap_with_dictionary(LOADED, recs[0])]), 1)
    assert offsets == [0] and bytes(records[0]) == recs[0]


class Broker:
    """A stand-in for the client's connection: `_on_owner` calls this object as the stub once (the retry
    loop is ClientConnection's); GetCompressionDictionary answers after `gate` opens."""

    def __init__(self, answer: bytes | Exception) -> None:
        self.answer = answer
        self.calls = 0
        self.gate = asyncio.Event()
        self.gate.set()
        self.entered = asyncio.Event()

    async def _on_owner(self, topic: str, call: Any, what: str) -> Any:
        self.calls += 1
        return await call(self)

    async def GetCompressionDictionary(self, request: Any, **call_options: Any) -> Any:
        self.entered.set()
        await self.gate.wait()
        if isinstance(self.answer, Exception):
            raise self.answer
        return pb.GetCompressionDictionaryResponse(id=request.id, dictionary=self.answer)


def _dictionaries(answer: bytes | Exception, registry: zdict.DictionaryRegistry | None = None) -> Any:
    broker = Broker(answer)
    return broker, Dictionaries(broker, registry or zdict.DictionaryRegistry())  # type: ignore[arg-type]


async def test_the_client_fetches_a_dictionary_once_for_concurrent_needs(loaded: bytes) -> None:
    broker, dicts = _dictionaries(loaded)
    broker.gate.clear()
    first = asyncio.create_task(dicts.ensure(TOPIC, LOADED))
    second = asyncio.create_task(dicts.ensure(TOPIC, LOADED))
    await asyncio.wait_for(broker.entered.wait(), 5)  # both are waiting for the one call by now
    broker.gate.set()
    await asyncio.gather(first, second)
    assert broker.calls == 1 and dicts.fetched == 1 and LOADED in dicts.registry
    await dicts.ensure(TOPIC, LOADED)  # held: no call
    assert broker.calls == 1


async def test_a_dictionary_the_broker_does_not_give_fails_clearly_and_is_asked_again_later() -> None:
    broker, dicts = _dictionaries(errors.NotFound("no zstd dictionary 888003 for namespace default"))
    for attempt in (1, 2):
        with pytest.raises(errors.NotFound, match=f"{TOPIC}: records need zstd dictionary {FETCHED}"):
            await dicts.ensure(TOPIC, FETCHED)
        assert broker.calls == attempt and FETCHED not in dicts.registry


async def test_a_wrong_answer_is_corruption_and_nothing_is_loaded(loaded: bytes) -> None:
    for answer in (loaded, b"not a dictionary"):  # another id's dictionary, or no dictionary at all
        _, dicts = _dictionaries(answer)
        with pytest.raises(errors.CorruptionError, match="the broker's answer is unusable"):
            await dicts.ensure(TOPIC, FETCHED)
        assert dicts.registry.ids() == []


async def test_decode_fetches_what_it_misses_then_decodes_again(samples: list[bytes]) -> None:
    data = zdict.train(samples, FETCHED)
    broker, dicts = _dictionaries(data)
    rounds: list[int] = []

    def decode() -> str:
        rounds.append(1)
        if FETCHED not in dicts.registry:
            raise MissingDictionary(FETCHED)
        return "decoded"

    assert await dicts.decode(TOPIC, decode) == "decoded"
    assert len(rounds) == 2 and broker.calls == 1

    def never() -> str:  # loaded, yet still missing (another registry): an error, not a loop
        raise MissingDictionary(FETCHED)

    with pytest.raises(errors.CorruptionError, match="after fetching it"):
        await dicts.decode(TOPIC, never)


class FakeClient:
    def __init__(self, dicts: Dictionaries) -> None:
        self.dictionaries = dicts
        self.connect_timeout = 5.0


async def test_a_consumer_whose_dictionary_fetch_fails_delivers_nothing_then_decodes_once_fetched(
    samples: list[bytes],
) -> None:
    other = zdict.DictionaryRegistry()
    data = zdict.train(samples, SUBSCRIBED)
    other.add(data)
    recs = _records(3)
    frames = b"".join(
        HEADER.pack(10 + i, len(w), crc32c(w)) + w
        for i, w in enumerate(wrap_with_dictionary(SUBSCRIBED, r, other) for r in recs)
    )
    resp = pb.ConsumeResponse(batch=pb.MessageBatch(frames=frames, count=3))
    queue: asyncio.Queue[Any] = asyncio.Queue()
    _, failing = _dictionaries(errors.NotFound("no zstd dictionary"), zdict.REGISTRY)
    sub = Subscriber(FakeClient(failing), TOPIC, "s", "c", 0, (), 100, queue)  # type: ignore[arg-type]
    with pytest.raises(errors.NotFound, match=f"records need zstd dictionary {SUBSCRIBED}"):
        await sub._messages_of(resp)
    assert sub._max_seen == -1 and queue.empty()  # nothing delivered, so nothing can be acked
    _, working = _dictionaries(data, zdict.REGISTRY)
    sub.client = FakeClient(working)  # type: ignore[assignment]
    messages = await sub._messages_of(resp)
    assert [m.offset for m in messages] == [10, 11, 12] and sub._max_seen == 12
    assert [m.payload for m in messages] == log_lines(3, seed=1)


def _publisher(dicts: Dictionaries, codec: Codec) -> PartitionPublisher:
    noop = lambda *_: None  # noqa: E731
    return PartitionPublisher(
        FakeClient(dicts),  # type: ignore[arg-type]
        TOPIC,
        "p",
        reliable=True,
        linger=0.0,
        max_batch_messages=10,
        max_batch_bytes=1 << 20,
        max_inflight=None,
        on_seal=noop,
        on_release=noop,
        codec=codec,
    )


async def test_a_zstd_producer_compresses_with_the_dictionary_the_broker_names(
    loaded: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    _, dicts = _dictionaries(loaded)
    pub = _publisher(dicts, Codec.ZSTD)
    pub._dictionary_named(LOADED)
    task = pub._dict_task
    assert task is not None and pub.dict_id == 0  # plain zstd until it is fetched
    await task
    assert pub.dict_id == LOADED
    b = Batch(1, asyncio.get_running_loop())
    b.segs.append([[b"x" * 300, b"y" * 300], 1, {}, None])
    b.count = 2
    records = msgspec.msgpack.decode(b.encode(1, "p", codec=Codec.ZSTD, dict_id=pub.dict_id))
    assert all(uses_dictionary(r) and dictionary_of(r) == LOADED for r in records)
    again = msgspec.msgpack.decode(b.encode(1, "p", codec=Codec.ZSTD, dict_id=0))  # a broker naming none
    assert not any(uses_dictionary(r) for r in again)  # re-sent there: compressed again, plain zstd
    pub._dictionary_named(0)  # the policy dropped it: plain zstd again
    assert pub.dict_id == 0

    _, down = _dictionaries(errors.Unavailable("broker down"))
    failing = _publisher(down, Codec.ZSTD)
    failing._dictionary_named(LOADED + 1)
    assert failing._dict_task is not None
    with caplog.at_level(logging.WARNING):
        await failing._dict_task
    assert failing.dict_id == 0 and "records stay plain zstd" in caplog.text  # not fatal
    failing._dictionary_named(LOADED + 1)
    assert failing._dict_task is None  # not asked again at every ack ...
    failing._forget_named(LOADED + 1)
    failing._dictionary_named(LOADED + 1)
    assert failing._dict_task is not None  # ... but after DICTIONARY_RETRY_SECONDS
    await failing._dict_task

    lz4 = _publisher(dicts, Codec.LZ4)
    lz4._dictionary_named(LOADED)
    assert lz4.dict_id == 0 and lz4._dict_task is None  # a dictionary is zstd's
