"""The metadata side of an unclean recovery (cluster/recovery.py) on the embedded store: what it refuses,
what it writes, and that a record changed between the survey and the write is left as it is."""

from __future__ import annotations

import pytest

from ister.cluster import recovery
from ister.core.cluster.ownership import OwnerRecord
from ister.core.replication import CopyEnd, ReplicaRecord
from ister.errors import FailedPrecondition, NotFound, Unavailable
from ister.ids import TopicName
from ister.metadata import keys
from ister.metadata.embedded import EmbeddedStore

NAME = TopicName.parse("/default/stranded")
RECORD = ReplicaRecord(replicas=[1, 2, 3], isr=[1, 2], leader=1, epoch=5, min_insync=2)


async def store_with(live: list[int]) -> EmbeddedStore:
    store = EmbeddedStore.in_memory()
    await store.put(keys.replicas(NAME), RECORD.to_json())
    await store.put(
        keys.owner(NAME), OwnerRecord(broker_id=1, epoch=5, loaded_epoch=5, reserved_until=900).to_json()
    )
    for b in live:
        await store.put(keys.broker_register(b), {"broker_url": f"http://b{b}"})
    return store


async def test_a_topic_with_a_live_in_sync_replica_or_no_record_is_refused() -> None:
    store = await store_with([2, 3])
    with pytest.raises(FailedPrecondition, match="are live"):
        await recovery.survey(store, NAME)
    with pytest.raises(NotFound, match="not replicated"):
        await recovery.survey(store, TopicName.parse("/default/other"))
    kv = await store.get(keys.replicas(NAME))
    assert kv is not None and ReplicaRecord.parse(kv.value) == RECORD  # nothing written


async def test_the_recovery_record_names_the_survivor_alone_and_resumes_after_the_reservation() -> None:
    store = await store_with([3])
    found = await recovery.survey(store, NAME)
    assert found.survivors == [3]
    plan = await recovery.plan(store, NAME, found, {3: CopyEnd(4, 700, 650)})
    assert (plan.leader, plan.kept_end, plan.acked_end, plan.resume_at) == (3, 700, 700, 900)
    await recovery.write(store, NAME, found, plan)
    kv = await store.get(keys.replicas(NAME))
    assert kv is not None and ReplicaRecord.parse(kv.value) == plan.record


async def test_a_record_changed_after_the_survey_is_left_alone() -> None:
    store = await store_with([3])
    found = await recovery.survey(store, NAME)
    plan = await recovery.plan(store, NAME, found, {3: CopyEnd(4, 700, 0)})
    back = RECORD.with_isr([1, 2])  # broker 1 came back and wrote its record meanwhile
    await store.put(keys.replicas(NAME), {**back.to_json(), "epoch": 6})
    with pytest.raises(Unavailable, match="changed meanwhile"):
        await recovery.write(store, NAME, found, plan)
    kv = await store.get(keys.replicas(NAME))
    assert kv is not None and kv.value["epoch"] == 6
