"""zstd dictionaries asked for by a namespace policy (docs/compression.md, "Dictionaries"): each topic of the
namespace without a policy of its own trains its own dictionary and records it in
`/ister/compression-namespace-dict/{ns}/{topic}`; clearing or changing the namespace policy stops their use
from the next publish on; a topic's own policy wins; the metadata store failing while the record is written
leaves records plain zstd and the same dictionary is named on the retry."""

from __future__ import annotations

import importlib
import json
from typing import Any

import pytest

from ister.broker.compression_admin import CompressionAdmin
from ister.broker.compression_dicts import DictionaryTrainer
from ister.broker.compression_naming import name_dictionary
from ister.broker.compression_policy import TopicCompressionPolicy, dictionary_in_effect
from ister.core import zdict
from ister.core.compression import ENVELOPE_SIZE, MARK, Codec, plain, uses_dictionary
from ister.errors import InvalidArgument, MetadataError
from ister.ids import TopicName
from ister.metadata import keys
from ister.metadata.cache import LocalCache
from ister.metadata.embedded import EmbeddedStore
from ister.metadata.records import NamespacePolicy, TopicCompression, namespace_dict_id
from ister.metadata.topic_catalog import erase_topic
from tests.unit.test_compression_dicts import records

A, B = TopicName.parse("/logs/a"), TopicName.parse("/logs/b")
SEEDS = {A: 11, B: 12}  # each topic's records differ
WITH_DICT = {"compression": "zstd", "compression_dictionary": True, "max_producers_per_topic": 3}
PREFIXES = [
    keys.COMPRESSION_PREFIX,
    keys.COMPRESSION_DICTS_PREFIX,
    keys.NAMESPACE_DICT_PREFIX,
    "/namespaces/",
]


class FailingNames(EmbeddedStore):
    """Writes of per-topic dictionary records fail (etcd down just then); everything else works."""

    fail = False

    async def compare_and_set(self, key: str, value: Any, **kw: Any) -> bool:
        if self.fail and key.startswith(keys.NAMESPACE_DICT_PREFIX):
            raise MetadataError("metadata store unreachable")
        return await super().compare_and_set(key, value, **kw)


def failing_store() -> FailingNames:
    store = EmbeddedStore.in_memory()
    store.__class__ = FailingNames
    return store  # type: ignore[return-value]


def admin_of(store: EmbeddedStore) -> CompressionAdmin:
    async def resolve(raw: str) -> tuple[TopicName, list[TopicName]]:
        name = TopicName.parse(raw)
        return name, [name]

    return CompressionAdmin(store, resolve)


class Setup:
    def __init__(self, store: EmbeddedStore) -> None:
        self.store = store
        self.cache = LocalCache(store, PREFIXES)
        self.spawned: list[Any] = []
        self.policies: dict[TopicName, TopicCompressionPolicy] = {}

    async def start(self, *topics: TopicName) -> Setup:
        await self.cache.start()
        for t in topics:
            trainer = DictionaryTrainer(self.store, t, self.spawned.append, zdict.REGISTRY, samples=100)
            self.policies[t] = TopicCompressionPolicy(self.cache, t, trainer)
        return self

    async def trained(self, topic: TopicName) -> int:
        """Publish 120 records to `topic` (its sample), wait for its training, and its recorded id."""
        before = len(self.spawned)
        self.policies[topic].stored_form(records(120, seed=SEEDS[topic]))
        assert len(self.spawned) == before + 1
        await self.spawned[-1]
        kv = await self.store.get(keys.topic_namespace_dict(topic))
        dict_id = namespace_dict_id(kv.value if kv else None)
        assert dict_id is not None
        assert await self.cache.wait_for(lambda: self.uses(topic) == dict_id, 5.0)
        return dict_id

    def mirrored_policy(self) -> NamespacePolicy:
        kv = self.cache.get(keys.namespace_policy("logs"))
        return NamespacePolicy.lenient(kv.value if kv is not None else None)

    def uses(self, topic: TopicName) -> int | None:
        """The dictionary the topic's next plain record is stored with (0: plain zstd, None: not zstd)."""
        stored = self.policies[topic].stored_form(records(1, seed=9))[0]
        if stored[0] != MARK or stored[1] != Codec.ZSTD:
            return None
        return zdict.dict_id_of(stored[ENVELOPE_SIZE:]) if uses_dictionary(stored) else 0


@pytest.fixture
async def ns() -> Any:
    store = EmbeddedStore.in_memory()
    await store.put(keys.namespace_policy("logs"), dict(WITH_DICT))
    setup = await Setup(store).start(A, B)
    yield setup
    await setup.cache.close()


def test_the_policy_in_effect_decides_which_dictionary_a_topic_uses() -> None:
    with_dict = NamespacePolicy.lenient(WITH_DICT)
    assert with_dict.compression_dictionary
    assert dictionary_in_effect(with_dict, None, None) == (True, 0)  # sampling
    assert dictionary_in_effect(with_dict, None, 42) == (True, 42)
    own = TopicCompression(compression="zstd")
    assert dictionary_in_effect(with_dict, own, 42) == (False, 0)  # the topic's own policy wins
    own_dict = TopicCompression(compression="zstd", dictionary=True, dictionary_id=7)
    assert dictionary_in_effect(with_dict, own_dict, 42) == (True, 7)
    cleared = NamespacePolicy.lenient({"compression": "zstd"})
    assert dictionary_in_effect(cleared, None, 42) == (False, 0)  # its record left: not used
    # a dictionary only with zstd, and only `true` asks for one
    assert not NamespacePolicy.lenient(
        {"compression": "lz4", "compression_dictionary": True}
    ).compression_dictionary
    assert not NamespacePolicy.lenient(
        {"compression": "zstd", "compression_dictionary": 1}
    ).compression_dictionary
    assert namespace_dict_id({"dictionary_id": 2**32}) is None and namespace_dict_id("x") is None


async def test_each_topic_of_the_namespace_trains_its_own_dictionary(ns: Setup) -> None:
    assert ns.uses(A) == 0 and ns.uses(B) == 0  # plain zstd while sampling
    a, b = await ns.trained(A), await ns.trained(B)
    assert a != b and {a, b} <= set(zdict.REGISTRY.ids())
    assert await ns.store.get(keys.topic_compression(A)) is None  # no topic policy was written
    later = records(50, seed=4)
    stored = ns.policies[A].stored_form(later)
    assert all(uses_dictionary(r) for r in stored) and [plain(r) for r in stored] == later
    assert sum(map(len, stored)) * 2.5 < sum(map(len, later))
    assert ns.uses(B) == b


async def test_changing_or_clearing_the_namespace_policy_stops_the_dictionaries(ns: Setup) -> None:
    admin = admin_of(ns.store)
    assert await admin.get_topic(A.full) == ("zstd", "namespace", True, 0)
    a = await ns.trained(A)
    assert await admin.get_topic(A.full) == ("zstd", "namespace", True, a)
    await ns.trained(B)
    # asked again with --dictionary: the topics keep theirs
    assert await admin.set_namespace("logs", "zstd", True) == ("zstd", "namespace", True, 0)
    assert await ns.store.get(keys.topic_namespace_dict(A)) is not None
    # zstd without a dictionary: from the next publish on, plain zstd; the topics' records are forgotten
    assert await admin.set_namespace("logs", "zstd") == ("zstd", "namespace", False, 0)
    assert await ns.cache.wait_for(lambda: ns.uses(A) == 0 and ns.uses(B) == 0, 5.0)
    assert await ns.store.list(keys.NAMESPACE_DICT_PREFIX) == []
    kv = await ns.store.get(keys.namespace_policy("logs"))
    assert kv is not None and kv.value == {"compression": "zstd", "max_producers_per_topic": 3}
    # asked again: a new dictionary, trained on the records of now
    await admin.set_namespace("logs", "zstd", True)
    assert await ns.cache.wait_for(lambda: ns.mirrored_policy().compression_dictionary, 5.0)
    assert await ns.trained(A) != a
    # cleared: no codec at all
    assert await admin.set_namespace("logs", "", clear=True) == ("none", "default", False, 0)
    assert await ns.cache.wait_for(lambda: ns.uses(A) is None, 5.0)
    assert ns.policies[A].stored_form(records(1))[0][0] != MARK
    kv = await ns.store.get(keys.namespace_policy("logs"))
    assert kv is not None and kv.value == {"max_producers_per_topic": 3}


async def test_a_recorded_dictionary_left_behind_is_not_used_once_the_policy_changed(ns: Setup) -> None:
    await ns.trained(A)
    await ns.store.put(keys.namespace_policy("logs"), {"compression": "zstd"})  # a delete that failed
    assert await ns.cache.wait_for(lambda: ns.uses(A) == 0, 5.0)


async def test_a_topic_policy_wins_over_the_namespace_dictionary(ns: Setup) -> None:
    await ns.store.put(keys.topic_compression(A), {"compression": "lz4"})
    assert await ns.cache.wait_for(lambda: ns.uses(A) is None, 5.0)
    ns.policies[A].stored_form(records(300))
    assert ns.spawned == []  # no sample taken: its policy asks for no dictionary
    # its own policy with a dictionary: named in its own record, not the namespace's
    await ns.store.put(keys.topic_compression(A), {"compression": "zstd", "dictionary": True})
    assert await ns.cache.wait_for(lambda: ns.uses(A) == 0, 5.0)
    ns.policies[A].stored_form(records(120))
    await ns.spawned[0]
    kv = await ns.store.get(keys.topic_compression(A))
    own = TopicCompression.lenient(kv.value if kv else None)
    assert own is not None and own.dictionary_id is not None
    assert await ns.store.get(keys.topic_namespace_dict(A)) is None
    assert await ns.cache.wait_for(lambda: ns.uses(A) == own.dictionary_id, 5.0)


async def test_a_training_that_ends_after_the_policy_changed_names_nothing(ns: Setup) -> None:
    ns.policies[A].stored_form(records(120))
    await ns.store.put(keys.namespace_policy("logs"), {"compression": "zstd"})  # before it stores
    await ns.spawned[0]
    assert await ns.store.get(keys.topic_namespace_dict(A)) is None
    assert len(await ns.store.list(keys.COMPRESSION_DICTS_PREFIX)) == 1  # stored, unused
    # named directly: nothing either, and no topic policy asks
    assert await name_dictionary(ns.store, A, 12345) is None


async def test_metadata_down_while_recording_keeps_plain_zstd_and_names_the_same_dictionary_later(
    monkeypatch: Any,
) -> None:
    store = failing_store()
    await store.put(keys.namespace_policy("logs"), dict(WITH_DICT))
    ns = await Setup(store).start(A)
    try:
        store.fail = True
        ns.policies[A].stored_form(records(120))
        await ns.spawned[0]  # trained and stored; recording it failed: logged, not raised
        assert await store.get(keys.topic_namespace_dict(A)) is None
        assert ns.uses(A) == 0  # plain zstd meanwhile
        ns.policies[A].stored_form(records(10))
        assert len(ns.spawned) == 1  # no new attempt before the retry delay
        trainer = ns.policies[A].trainer
        assert trainer is not None
        monkeypatch.setattr("ister.broker.compression_dicts.RETRY_SECONDS", 0.0)
        trainer._not_before = 0.0
        store.fail = False
        ns.policies[A].stored_form(records(1, seed=3))
        assert len(ns.spawned) == 2
        await ns.spawned[1]
        stored = await store.list(keys.COMPRESSION_DICTS_PREFIX)
        assert len(stored) == 1  # the retry named the dictionary stored before, not a new one
        kv = await store.get(keys.topic_namespace_dict(A))
        assert kv is not None and keys.compression_dict(kv.value["dictionary_id"]) == stored[0].key
        assert await ns.cache.wait_for(lambda: ns.uses(A) == kv.value["dictionary_id"], 5.0)
    finally:
        await ns.cache.close()


async def test_the_admin_checks_the_namespace_request_and_shows_it(ns: Setup) -> None:
    admin = admin_of(ns.store)
    with pytest.raises(InvalidArgument, match="needs zstd"):
        await admin.set_namespace("logs", "lz4", True)
    with pytest.raises(InvalidArgument, match="not both"):
        await admin.set_namespace("logs", "zstd", False, True)
    with pytest.raises(InvalidArgument, match="neither"):
        await admin.set_namespace("logs", "")
    assert await admin.get_namespace("logs") == ("zstd", "namespace", True, 0)
    # a topic's own policy: its own record, whatever the namespace's topics trained
    await ns.store.put(keys.topic_namespace_dict(A), {"dictionary_id": 555})
    assert await admin.get_topic(A.full) == ("zstd", "namespace", True, 555)
    await admin.set_topic(A.full, "gzip", False)
    assert await admin.get_topic(A.full) == ("gzip", "topic", False, 0)


async def test_the_metadata_store_down_fails_the_admin_change_clearly() -> None:
    class Down(EmbeddedStore):
        async def delete_prefix(self, prefix: str) -> int:
            raise MetadataError("metadata store unreachable")

    store = EmbeddedStore.in_memory()
    store.__class__ = Down
    await store.put(keys.namespace_policy("logs"), dict(WITH_DICT))
    await store.put(keys.topic_namespace_dict(A), {"dictionary_id": 555})
    with pytest.raises(MetadataError):
        await admin_of(store).set_namespace("logs", "zstd")
    # the policy changed first, so publishes stop using the dictionary even though its record stayed
    kv = await store.get(keys.namespace_policy("logs"))
    assert kv is not None and not NamespacePolicy.lenient(kv.value).compression_dictionary


async def test_a_deleted_topic_forgets_its_dictionary_record() -> None:
    store = EmbeddedStore.in_memory()
    await store.put(keys.topic_namespace_dict(A), {"dictionary_id": 555})
    await store.put(keys.topic_namespace_dict(B), {"dictionary_id": 556})
    await erase_topic(store, A)
    assert await store.get(keys.topic_namespace_dict(A)) is None
    assert await store.get(keys.topic_namespace_dict(B)) is not None


def test_the_cli_shows_a_dictionary_being_sampled_as_null(capsys: Any) -> None:
    importlib.import_module("ister.cli.main")  # first: it imports the command modules in their order
    from ister.cli.admin import Output
    from ister.cli.compression import _emit
    from ister.wire.gen import ister_v1_pb2 as pb

    sampling = pb.CompressionResponse(compression="zstd", source="namespace", dictionary=True)
    _emit(Output.json, "/logs/a", sampling)
    assert json.loads(capsys.readouterr().out)["dictionary_id"] is None
    _emit(Output.table, "/logs/a", sampling)
    assert "zstd (namespace), dictionary (sampling)" in capsys.readouterr().out
    _emit(
        Output.json,
        "/logs/a",
        pb.CompressionResponse(compression="zstd", source="topic", dictionary=True, dictionary_id=7),
    )
    assert json.loads(capsys.readouterr().out)["dictionary_id"] == 7
    _emit(Output.json, "logs", sampling, topic=False)
    assert json.loads(capsys.readouterr().out) == {
        "name": "logs",
        "compression": "zstd",
        "source": "namespace",
        "dictionary": True,
    }
    _emit(Output.table, "logs", sampling, topic=False)
    assert "a dictionary per topic" in capsys.readouterr().out
