"""Issue 17 through the Ister client and the batch API: registering and resolving, producers that stamp
their schema, enforce refusing a whole batch (nothing of it stored), warn storing it, and consumers that
decode by the stamped version."""

from __future__ import annotations

import io
import json

import fastavro
import grpc
import pytest

from ister import errors
from ister.client import Client
from ister.wire.gen import DanubeAdmin_pb2 as apb
from ister.wire.gen import DanubeAdmin_pb2_grpc as apb_grpc
from tests.integration.harness import BrokerProcess

pytestmark = pytest.mark.integration

AVRO = {
    "type": "record",
    "name": "Reading",
    "fields": [{"name": "id", "type": "long"}, {"name": "v", "type": "double"}],
}


def datum(value: dict[str, object]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(AVRO), value)
    return out.getvalue()


async def test_batch_api_enforce_warn_and_decode(shared_broker: BrokerProcess, topic: str) -> None:
    subject = "readings-" + topic.rsplit("/", 1)[1]
    async with Client(shared_broker.url) as c:
        reg = await c.schemas.register(subject, "avro", json.dumps(AVRO))
        assert (reg.version, reg.is_new_version) == (1, True)
        p = await c.producer(topic, "p", schema_subject=subject)
        assert p.schema is not None and (p.schema.schema_id, p.schema.version) == (reg.schema_id, 1)
        cons = await c.consumer(topic, "readers", type="exclusive")
        await c.schemas.configure_topic(topic, subject, "enforce", True)
        good = [datum({"id": i, "v": i / 2}) for i in range(10)]
        offsets = await p.send_batch(good)
        assert offsets == list(range(10))
        before = (await c.offsets(topic)).next
        with pytest.raises(errors.InvalidArgument, match=subject):
            await p.send_batch([*good[:5], b"\x01", *good[5:]])
        assert (await c.offsets(topic)).next == before  # nothing of the refused batch was stored
        plain = await c.producer(topic, "plain")
        with pytest.raises(errors.InvalidArgument, match="no schema id"):
            await plain.send_batch(good[:2])
        await c.schemas.update_topic_policy(topic, "warn", True)
        p2 = await c.producer(topic, "p2", schema_subject=subject)
        stored = await p2.send_batch([b"\x01", good[0]])
        assert len(stored) == 2
        got = []
        while len(got) < 12:
            batch = await cons.receive_batch(12 - len(got), 5.0)
            assert batch, f"received {len(got)} of 12"
            await cons.ack_batch(batch)
            got += batch
        assert [await c.schemas.decode(m) for m in got[:2]] == [{"id": 0, "v": 0.0}, {"id": 1, "v": 0.5}]
        assert got[10].payload == b"\x01" and got[10].schema_id == reg.schema_id


async def test_pinned_and_minimum_versions(shared_broker: BrokerProcess, topic: str) -> None:
    subject = "pins-" + topic.rsplit("/", 1)[1]
    v2 = {**AVRO, "fields": [*AVRO["fields"], {"name": "unit", "type": "string", "default": "C"}]}  # type: ignore[list-item]
    async with Client(shared_broker.url) as c:
        await c.schemas.register(subject, "avro", json.dumps(AVRO))
        await c.schemas.register(subject, "avro", json.dumps(v2))
        pinned = await c.producer(topic, "pinned", schema_subject=subject, schema_version=1)
        minimum = await c.producer(topic, "min", schema_subject=subject, schema_min_version=2)
        assert pinned.schema is not None and pinned.schema.version == 1
        assert minimum.schema is not None and minimum.schema.version == 2
        with pytest.raises(errors.FailedPrecondition):
            await c.producer(topic, "none", schema_subject=subject, schema_min_version=3)
        assert [v["version"] for v in await c.schemas.versions(subject)] == [1, 2]
        incompatible = {**AVRO, "fields": [{"name": "id", "type": "string"}]}
        assert await c.schemas.check(subject, "avro", json.dumps(incompatible))


async def test_a_producer_binds_an_unbound_topic_to_its_subject(
    shared_broker: BrokerProcess, topic: str
) -> None:
    """As danube's CreateProducer with a schema_ref: the topic a producer with a subject creates names that
    subject (DescribeTopic, the console's topic page); a producer naming another subject is refused."""
    subject = "bound-" + topic.rsplit("/", 1)[1]
    async with Client(shared_broker.url) as c:
        reg = await c.schemas.register(subject, "avro", json.dumps(AVRO))
        await c.schemas.register(subject + "-other", "avro", json.dumps(AVRO))
        p = await c.producer(topic, "p", schema_subject=subject)
        assert await p.send_batch([datum({"id": 1, "v": 0.5})]) == [0]
        async with grpc.aio.insecure_channel(shared_broker.admin_addr) as channel:
            described = await apb_grpc.TopicAdminStub(channel).DescribeTopic(
                apb.DescribeTopicRequest(name=topic), timeout=10
            )
        assert (described.schema_subject, described.schema_id, described.schema_version) == (
            subject,
            reg.schema_id,
            1,
        )
        assert described.schema_type == "avro"
        with pytest.raises(errors.FailedPrecondition, match=f"uses schema subject '{subject}'"):
            await c.producer(topic, "q", schema_subject=subject + "-other")
