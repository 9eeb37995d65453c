"""Issue 17 in cluster mode: every broker answers the registry, concurrent registrations on two brokers
never hand out one id twice nor lose a version, and a policy set through one broker is enforced by the
topic's owner."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import danube
import grpc
import pytest
from danube.schema import SchemaType

from tests.etcd_server import EtcdServer
from tests.integration.cluster import Cluster
from tests.integration.harness import client

pytestmark = pytest.mark.integration


@pytest.fixture
async def pair(tmp_path: Path, etcd_server: EtcdServer) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path, etcd_server.endpoint, 2)
    try:
        await c.start()
        yield c
    finally:
        await c.stop()


def schema(n: int) -> bytes:
    props = {f"f{i}": {"type": "integer"} for i in range(n + 1)}
    return json.dumps({"type": "object", "properties": props}).encode()


async def test_concurrent_registrations_on_two_brokers(pair: Cluster) -> None:
    a, b = [await client(x.url) for x in pair.brokers]

    async def reg(c: danube.DanubeClient, subject: str, n: int) -> int:
        builder = c.schema().register_schema(subject).with_type(SchemaType.JSON_SCHEMA)
        return int(await builder.with_schema_data(schema(n)).execute())

    # 20 new subjects at once, half through each broker: 20 distinct ids
    ids = await asyncio.gather(*(reg(a if i % 2 else b, f"s{i}", 0) for i in range(20)))
    assert len(set(ids)) == 20
    # one subject, ten versions registered at once through both brokers (mode none: all accepted)
    await reg(a, "shared", 0)
    await a.schema().set_compatibility_mode("shared", danube.schema.CompatibilityMode.NONE)
    shared = await asyncio.gather(*(reg(a if i % 2 else b, "shared", i) for i in range(1, 11)))
    assert len(set(shared)) == 1
    assert await b.schema().list_versions("shared") == list(range(1, 12))
    # every broker answers reads of what another wrote
    latest_a = await a.schema().get_latest_schema("s3")
    latest_b = await b.schema().get_latest_schema("s3")
    assert latest_a.schema_id == latest_b.schema_id and latest_a.fingerprint == latest_b.fingerprint


async def test_policy_set_anywhere_is_enforced_by_the_owner(pair: Cluster) -> None:
    topic = "/default/schema_cluster_orders"
    a, b = [await client(x.url) for x in pair.brokers]
    doc = {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}
    await (
        a.schema()
        .register_schema("orders")
        .with_type(SchemaType.JSON_SCHEMA)
        .with_schema_data(json.dumps(doc).encode())
        .execute()
    )
    p = (
        a.new_producer()
        .with_topic(topic)
        .with_name("p")
        .with_schema_subject("orders")
        .with_dispatch_strategy(danube.DispatchStrategy.RELIABLE)
        .build()
    )
    await p.create()
    await p.send(b'{"id": 1}', {})
    owner = await pair.until(lambda: pair.assignments(), "topic assigned")
    assert topic in owner
    # configure through both brokers in turn; whichever it was, the owner refuses a bad payload
    for c in (a, b):
        await c.schema().configure_topic_schema(topic, "orders", "none", False)
        await c.schema().update_topic_validation_policy(topic, "enforce", True)
        refused = None
        deadline = asyncio.get_running_loop().time() + 10.0
        while refused is None:  # the owner learns the policy from its watch
            assert asyncio.get_running_loop().time() < deadline, "policy never reached the owner"
            try:
                await p.send(b'{"id": "x"}', {})
            except grpc.aio.AioRpcError as exc:
                refused = exc
        assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
        await p.send(b'{"id": 2}', {})
