"""Issue 17: the schema registry with the official danube-client against a real broker: register, evolve,
refuse an incompatible version, producers built with each of the three schema options stamping
schema_id/version, validation policies enforce and warn, admin CreateTopic with a subject, and errors that
name their reason and change nothing."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import danube
import grpc
import pytest
from danube.proto import SchemaRegistry_pb2 as spb
from danube.proto import SchemaRegistry_pb2_grpc as spb_grpc
from danube.schema import CompatibilityMode, SchemaType
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.harness import BrokerProcess, client, consumer, take
from tests.support import until

pytestmark = pytest.mark.integration

ORDER_V1 = {
    "type": "object",
    "properties": {"id": {"type": "integer"}, "item": {"type": "string"}},
    "required": ["id", "item"],
    "additionalProperties": False,
}
ORDER_V2 = {**ORDER_V1, "properties": {**ORDER_V1["properties"], "note": {"type": "string"}}}  # type: ignore[dict-item]
ORDER_BAD = {**ORDER_V1, "properties": {"id": {"type": "string"}, "item": {"type": "string"}}}


def js(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode()


async def register(c: danube.DanubeClient, subject: str, doc: dict[str, Any], kind: SchemaType) -> int:
    return int(await c.schema().register_schema(subject).with_type(kind).with_schema_data(js(doc)).execute())


def stub(broker: BrokerProcess) -> tuple[grpc.aio.Channel, Any]:
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{broker.port}")
    return channel, spb_grpc.SchemaRegistryStub(channel)


def metric(broker: BrokerProcess, name: str, **labels: str) -> float:
    with urllib.request.urlopen(broker.metrics_url, timeout=5) as resp:
        text = resp.read().decode()
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


async def test_register_evolve_and_reject(shared_broker: BrokerProcess, topic: str) -> None:
    c = await client(shared_broker.url)
    subject = "orders-" + topic.rsplit("/", 1)[1]
    schema_id = await register(c, subject, ORDER_V1, SchemaType.JSON_SCHEMA)
    # idempotent by fingerprint: the same schema, laid out differently, is version 1 again
    channel, registry = stub(shared_broker)
    again = await registry.RegisterSchema(
        spb.RegisterSchemaRequest(
            subject=subject,
            schema_type="json_schema",
            schema_definition=json.dumps(ORDER_V1, indent=2).encode(),
        )
    )
    assert (again.schema_id, again.version, again.is_new_version) == (schema_id, 1, False)
    assert again.fingerprint.startswith("sha256:")
    # a compatible evolution (an optional property in a closed object) is version 2, same id
    assert await register(c, subject, ORDER_V2, SchemaType.JSON_SCHEMA) == schema_id
    assert await c.schema().list_versions(subject) == [1, 2]
    latest = await c.schema().get_latest_schema(subject)
    assert (latest.schema_id, latest.version, latest.schema_type) == (schema_id, 2, "json_schema")
    envelope = json.loads(latest.schema_definition)
    assert json.loads(envelope["JsonSchema"]["raw_schema"]) == ORDER_V2
    v1 = await c.schema().get_schema_version(schema_id, 1)
    assert (
        v1.version == 1
        and json.loads(json.loads(v1.schema_definition)["JsonSchema"]["raw_schema"]) == ORDER_V1
    )
    # an incompatible one is refused with the reason, and nothing changes
    ok, errors = await c.schema().check_compatibility(subject, js(ORDER_BAD), SchemaType.JSON_SCHEMA)
    assert not ok and any("'id'" in e for e in errors)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await register(c, subject, ORDER_BAD, SchemaType.JSON_SCHEMA)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "incompatible" in (refused.value.details() or "")
    assert await c.schema().list_versions(subject) == [1, 2]
    # under mode none the same change is accepted
    await c.schema().set_compatibility_mode(subject, CompatibilityMode.NONE)
    assert await register(c, subject, ORDER_BAD, SchemaType.JSON_SCHEMA) == schema_id
    assert await c.schema().list_versions(subject) == [1, 2, 3]
    assert (
        await registry.GetLatestSchema(spb.GetLatestSchemaRequest(subject=subject))
    ).compatibility_mode == "none"
    await channel.close()


async def test_producers_stamp_resolved_versions(shared_broker: BrokerProcess, topic: str) -> None:
    c = await client(shared_broker.url)
    subject = "avro-" + topic.rsplit("/", 1)[1]
    v1 = {"type": "record", "name": "Ping", "fields": [{"name": "n", "type": "int"}]}
    v2 = {**v1, "fields": [*v1["fields"], {"name": "s", "type": "string", "default": ""}]}
    schema_id = await register(c, subject, v1, SchemaType.AVRO)
    await register(c, subject, v2, SchemaType.AVRO)
    builders = [
        c.new_producer().with_topic(topic).with_name("latest").with_schema_subject(subject),
        c.new_producer().with_topic(topic).with_name("pinned").with_schema_version(subject, 1),
        c.new_producer().with_topic(topic).with_name("minimum").with_schema_min_version(subject, 2),
    ]
    producers = [b.with_dispatch_strategy(danube.DispatchStrategy.RELIABLE).build() for b in builders]
    for p in producers:
        await p.create()
    cons, queue = await consumer(c, topic, "reader", "sub")
    for p in producers:
        await p.send(b"\x02\x00", {})  # n=1 (and s="" for v2): stamped, not validated (policy none)
    got = await take(queue, 3, ack=cons)
    stamps = {m.producer_name: (m.schema_id, m.schema_version) for m in got}
    assert stamps == {"latest": (schema_id, 2), "pinned": (schema_id, 1), "minimum": (schema_id, 2)}
    too_new = (
        c.new_producer()
        .with_topic(topic)
        .with_name("too-new")
        .with_schema_min_version(subject, 3)
        .with_dispatch_strategy(danube.DispatchStrategy.RELIABLE)
        .build()
    )
    with pytest.raises(Exception, match="3"):
        await too_new.create()
    # the topic is now bound to the subject; another subject is refused
    config = await c.schema().get_topic_schema_config(topic)
    assert (config.schema_subject, config.schema_id, config.validation_policy) == (subject, schema_id, "none")
    other = "other-" + topic.rsplit("/", 1)[1]
    await register(c, other, v1, SchemaType.AVRO)
    wrong = (
        c.new_producer()
        .with_topic(topic)
        .with_name("wrong")
        .with_schema_subject(other)
        .with_dispatch_strategy(danube.DispatchStrategy.RELIABLE)
        .build()
    )
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await wrong.create()
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    await cons.close()


async def test_enforce_refuses_and_warn_stores(shared_broker: BrokerProcess, topic: str) -> None:
    c = await client(shared_broker.url)
    subject = "enf-" + topic.rsplit("/", 1)[1]
    await register(c, subject, ORDER_V1, SchemaType.JSON_SCHEMA)
    reliable = danube.DispatchStrategy.RELIABLE
    producer = (
        c.new_producer()
        .with_topic(topic)
        .with_name("p")
        .with_schema_subject(subject)
        .with_dispatch_strategy(reliable)
        .build()
    )
    await producer.create()
    plain = c.new_producer().with_topic(topic).with_name("plain").with_dispatch_strategy(reliable).build()
    await plain.create()
    ok, _ = await c.schema().configure_topic_schema(topic, subject, "enforce", True)
    assert ok
    cons, queue = await consumer(c, topic, "reader", "sub")
    await producer.send(b'{"id": 1, "item": "pen"}', {})
    for bad in (b'{"id": "one", "item": "pen"}', b"not json"):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await producer.send(bad, {})
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert subject in (refused.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as no_id:
        await plain.send(b'{"id": 2, "item": "x"}', {})
    assert "no schema id" in (no_id.value.details() or "")
    name = "ister_schema_validation_failures_total"
    # the exporter serves a body a few milliseconds old: wait for the counts rather than read them once
    await until(lambda: metric(shared_broker, name, policy="enforce") >= 3, "enforce failures counted")
    # warn: stored and counted
    ok, _ = await c.schema().update_topic_validation_policy(topic, "warn", True)
    assert ok
    await producer.send(b'{"id": "two"}', {})
    await producer.send(b'{"id": 3, "item": "cup"}', {})
    got = await take(queue, 3, ack=cons)
    assert [m.payload for m in got] == [
        b'{"id": 1, "item": "pen"}',
        b'{"id": "two"}',
        b'{"id": 3, "item": "cup"}',
    ]
    await until(
        lambda: metric(shared_broker, name, policy="warn", reason="payload_invalid") >= 1,
        "warn failure counted",
    )
    await cons.close()


async def test_errors_name_the_reason_and_change_nothing(shared_broker: BrokerProcess, topic: str) -> None:
    c = await client(shared_broker.url)
    channel, registry = stub(shared_broker)
    subject = "err-" + topic.rsplit("/", 1)[1]
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await c.schema().get_latest_schema(subject)
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND and subject in (missing.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as bad:
        await (
            c.schema()
            .register_schema(subject)
            .with_type(SchemaType.AVRO)
            .with_schema_data(b"{oops")
            .execute()
        )
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "Avro" in (bad.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as proto:
        await (
            c.schema()
            .register_schema(subject)
            .with_type(SchemaType.PROTOBUF)
            .with_schema_data(b"message X { int32 a = 1 }")
            .execute()
        )
    assert proto.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as gone:
        await c.schema().list_versions(subject)
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND  # nothing was created by the failed registrations
    # a version in use by a topic cannot be deleted
    await register(c, subject, ORDER_V1, SchemaType.JSON_SCHEMA)
    await register(c, subject, ORDER_V2, SchemaType.JSON_SCHEMA)
    p = c.new_producer().with_topic(topic).with_name("p").with_schema_subject(subject).build()
    await p.create()
    with pytest.raises(grpc.aio.AioRpcError) as in_use:
        await c.schema().delete_schema_version(subject, 1)
    assert in_use.value.code() == grpc.StatusCode.FAILED_PRECONDITION and topic in (
        in_use.value.details() or ""
    )
    assert await c.schema().list_versions(subject) == [1, 2]
    with pytest.raises(grpc.aio.AioRpcError) as mode:
        await registry.SetCompatibilityMode(
            spb.SetCompatibilityModeRequest(subject=subject, compatibility_mode="sideways")
        )
    assert mode.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as policy:
        await c.schema().configure_topic_schema(topic, subject, "strict", True)
    assert policy.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    await channel.close()


async def test_protobuf_subject_validates_by_decoding(shared_broker: BrokerProcess, topic: str) -> None:
    c = await client(shared_broker.url)
    subject = "pb-" + topic.rsplit("/", 1)[1]
    proto = b'syntax = "proto3"; package shop; message Order { int64 id = 1; string item = 2; }'
    schema_id = int(
        await c.schema()
        .register_schema(subject)
        .with_type(SchemaType.PROTOBUF)
        .with_schema_data(proto)
        .execute()
    )
    removed = b'syntax = "proto3"; package shop; message Order { int64 id = 1; }'
    ok, errors = await c.schema().check_compatibility(subject, removed, SchemaType.PROTOBUF)
    assert not ok and any("reserv" in e for e in errors)
    reserved = b'syntax = "proto3"; package shop; message Order { reserved 2; int64 id = 1; }'
    ok, _ = await c.schema().check_compatibility(subject, reserved, SchemaType.PROTOBUF)
    assert ok
    p = c.new_producer().with_topic(topic).with_name("p").with_schema_subject(subject).build()
    await p.create()
    await c.schema().configure_topic_schema(topic, subject, "enforce", True)
    await p.send(b"\x08\x07\x12\x03pen", {})  # id=7, item="pen"
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await p.send(b"\x08", {})  # truncated varint
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    latest = await c.schema().get_latest_schema(subject)
    assert latest.schema_id == schema_id
    assert json.loads(latest.schema_definition)["Protobuf"]["message_name"] == "shop.Order"


async def test_admin_create_topic_with_subject(shared_broker: BrokerProcess, topic: str) -> None:
    from ister.wire.gen import DanubeAdmin_pb2 as apb
    from ister.wire.gen import DanubeAdmin_pb2_grpc as apb_grpc

    c = await client(shared_broker.url)
    subject = "adm-" + topic.rsplit("/", 1)[1]
    async with grpc.aio.insecure_channel(shared_broker.admin_addr) as channel:
        admin = apb_grpc.TopicAdminStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await admin.CreateTopic(apb.NewTopicRequest(name=topic, schema_subject=subject))
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND and subject in (
            missing.value.details() or ""
        )
        schema_id = await register(c, subject, ORDER_V1, SchemaType.JSON_SCHEMA)
        # the failed call created nothing: the same name is free
        await admin.CreateTopic(apb.NewTopicRequest(name=topic, schema_subject=subject))
        config = await c.schema().get_topic_schema_config(topic)
        assert (config.schema_subject, config.schema_id) == (subject, schema_id)
        assert (config.validation_policy, config.enable_payload_validation) == ("warn", True)
        # the registry is served on the admin port too
        registry = spb_grpc.SchemaRegistryStub(channel)
        latest = await registry.GetLatestSchema(spb.GetLatestSchemaRequest(subject=subject))
        assert latest.schema_id == schema_id
