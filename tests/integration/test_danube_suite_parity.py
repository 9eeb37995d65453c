"""Issue 36: what the official client's own integration suite does, written for this project (its files are
not copied): JSON Schema evolution through the client's builders under the default rules, the strict rules
chosen per subject, and Key-Shared collected the way that suite collects (reads pending on both consumers,
each message acknowledged while the other consumer's read is still pending).

(This module imports `danube`; it must not import the `ister.wire` Danube protobuf modules.)
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import danube
import grpc
import pytest

from tests.integration.harness import BrokerProcess, client, consumer, producer, take

pytestmark = pytest.mark.integration

V1 = {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}
V2 = {**V1, "properties": {"id": {"type": "integer"}, "email": {"type": "string"}}}
V3_REQUIRED = {
    **V2,
    "required": ["id", "phone"],
    "properties": {**V2["properties"], "phone": {"type": "string"}},
}  # type: ignore[dict-item]


class ModeText:
    """A mode string the client's enum cannot spell (Ister's `mode:rules` extension), sent as is."""

    def __init__(self, text: str) -> None:
        self.text = text

    def as_string(self) -> str:
        return self.text


async def register(c: danube.DanubeClient, subject: str, doc: dict[str, Any]) -> int:
    builder = c.schema().register_schema(subject).with_type(danube.SchemaType.JSON_SCHEMA)
    return int(await builder.with_schema_data(json.dumps(doc).encode()).execute())


async def schema_version_seen(c: danube.DanubeClient, topic: str, name: str, builder: Any) -> int:
    p = builder.with_topic(topic).with_name(name).build()
    await p.create()
    cons, q = await consumer(c, topic, f"{name}-c", f"{name}-sub")
    await p.send(b'{"id": 7}')
    (msg,) = await take(q, 1, ack=cons)
    await cons.close()
    await p.close()
    return int(msg.schema_version)


async def test_json_schema_evolution_through_the_official_builders(
    shared_broker: BrokerProcess, topic: str
) -> None:
    c = await client(shared_broker.url)
    subject = "people-" + topic.rsplit("/", 1)[1]
    first = await register(c, subject, V1)
    assert await register(c, subject, V2) == first  # an added optional property: version 2 of the subject
    ok, errors = await c.schema().check_compatibility(
        subject, json.dumps(V3_REQUIRED).encode(), danube.SchemaType.JSON_SCHEMA
    )
    assert not ok and any("'phone'" in e and "required" in e for e in errors), errors
    latest = c.new_producer().with_schema_subject(subject)
    pinned = c.new_producer().with_schema_version(subject, 1)
    minimum = c.new_producer().with_schema_min_version(subject, 2)
    assert await schema_version_seen(c, topic, "latest", latest) == 2
    assert await schema_version_seen(c, topic, "pinned", pinned) == 1
    assert await schema_version_seen(c, topic, "minimum", minimum) == 2
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await register(c, subject, V3_REQUIRED)
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert await c.schema().list_versions(subject) == [1, 2]  # the refused one changed nothing


async def test_strict_json_rules_chosen_per_subject(shared_broker: BrokerProcess, topic: str) -> None:
    c = await client(shared_broker.url)
    subject = "strict-" + topic.rsplit("/", 1)[1]
    await register(c, subject, V1)
    await c.schema().set_compatibility_mode(subject, ModeText("backward:strict"))  # type: ignore[arg-type]
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await register(c, subject, V2)
    assert "added to an open object" in str(refused.value.details())
    await c.schema().set_compatibility_mode(subject, ModeText("backward:danube"))  # type: ignore[arg-type]
    await register(c, subject, V2)
    assert await c.schema().list_versions(subject) == [1, 2]


async def _tagged(queue: asyncio.Queue, tag: int) -> tuple[int, Any]:  # type: ignore[type-arg]
    return tag, await queue.get()


@pytest.mark.parametrize("keys", [["keyA", "keyB"], ["payment", "shipping", "payment", "invoice", "payment"]])
async def test_key_shared_collected_the_way_the_official_suite_does(
    shared_broker: BrokerProcess, topic: str, keys: list[str]
) -> None:
    """Each round reads both consumers' queues at once and acks what arrived while the other read is still
    pending; then the pending read is cancelled. A message that reached a queue only during that ack is
    taken by a read the loop throws away, so this collects everything only if every message of a key is
    already queued at its consumer, not sent one per ack (Danube's dispatch, and Ister's before issue 36)."""
    c = await client(shared_broker.url)
    p = await producer(c, topic, "ks-p", reliable=True)
    c1, q1 = await consumer(c, topic, "ks-1", "ks", danube.SubType.KEY_SHARED)
    c2, q2 = await consumer(c, topic, "ks-2", "ks", danube.SubType.KEY_SHARED)
    total = 10
    for i in range(total):
        await p.send_with_key(f"m{i}".encode(), None, keys[i % len(keys)])
    consumers = {1: c1, 2: c2}
    got: list[tuple[int, Any]] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 15.0
    while len(got) < total:
        remaining = deadline - loop.time()
        assert remaining > 0, f"collected {len(got)} of {total}"
        reads = [asyncio.create_task(_tagged(q1, 1)), asyncio.create_task(_tagged(q2, 2))]
        done, pending = await asyncio.wait(reads, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            tag, msg = task.result()
            await consumers[tag].ack(msg)
            got.append((tag, msg))
        for task in pending:
            task.cancel()
    owner: dict[str, int] = {}
    for tag, msg in got:
        assert owner.setdefault(msg.routing_key, tag) == tag, f"key {msg.routing_key} at two consumers"
    by_key: dict[str, list[int]] = {}
    for _, msg in got:
        by_key.setdefault(msg.routing_key, []).append(msg.msg_id.topic_offset)
    assert all(offsets == sorted(offsets) for offsets in by_key.values()), by_key  # in order per key
    await c1.close()
    await c2.close()
    await p.close()
