"""Cluster mode with TLS and JWT authentication: two brokers on a real etcd, every port TLS, one shared
HS256 secret. A client that asks the broker not owning a topic is redirected by lookup to the owner's
https:// URL and works there; plaintext is refused on every broker."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import danube
import grpc
import pytest
from danube.proto import DanubeApi_pb2 as dpb
from danube.proto import DanubeApi_pb2_grpc as dpb_grpc

from ister.client.client import Client
from tests.etcd_server import EtcdServer
from tests.integration.cluster import WAIT, Cluster
from tests.integration.harness import BrokerProcess, consumer, producer, take
from tests.integration.security_support import Pki, make_pki, secret_file, token

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


@pytest.fixture
async def cluster(tmp_path: Path, etcd_server: EtcdServer, pki: Pki) -> AsyncIterator[Cluster]:
    c = Cluster(
        tmp_path,
        etcd_server.endpoint,
        2,
        2,
        *("--tls-cert", str(pki.cert_file), "--tls-key", str(pki.key_file)),
        *("--auth-jwt-secret-file", str(secret_file(tmp_path)), "--superuser", "app"),
    )
    try:
        await c.start()
        yield c
    finally:
        await c.stop()


def https(b: BrokerProcess) -> str:
    return f"https://127.0.0.1:{b.port}"


async def secure_client(b: BrokerProcess, pki: Pki, jwt: str) -> danube.DanubeClient:
    builder = danube.DanubeClientBuilder().service_url(https(b)).with_tls(str(pki.ca_file))
    return await builder.with_token(jwt).build()


async def tls_lookup(b: BrokerProcess, pki: Pki, topic: str, jwt: str) -> tuple[str, str]:
    creds = grpc.ssl_channel_credentials(pki.ca_file.read_bytes())
    async with grpc.aio.secure_channel(f"127.0.0.1:{b.port}", creds) as ch:
        resp = await dpb_grpc.DiscoveryStub(ch).TopicLookup(
            dpb.TopicLookupRequest(request_id=1, topic=topic),
            metadata=[("authorization", f"Bearer {jwt}")],
            timeout=10,
        )
    kind = "connect" if resp.response_type == dpb.TopicLookupResponse.Connect else "redirect"
    return kind, resp.broker_url


async def test_redirect_to_the_other_broker_over_https(cluster: Cluster, pki: Pki) -> None:
    jwt = token("app")
    c = await secure_client(cluster.brokers[0], pki, jwt)
    topics = [f"/default/secure{i}" for i in range(4)]
    for t in topics:
        p = await producer(c, t, "p", reliable=True)
        await p.send(b"hello", {})

    async def owners() -> dict[str, int] | None:
        found = await cluster.assignments()
        return found if all(t in found for t in topics) else None

    owner_of = await cluster.until(owners, "all topics assigned")
    by_id = {cluster.broker_id(b): b for b in cluster.brokers}
    # A topic that the first broker does not own (the load manager spreads 4 topics over 2 brokers).
    topic = next(t for t in topics if owner_of[t] != cluster.broker_id(cluster.brokers[0]))
    owner = by_id[owner_of[topic]]
    entry = cluster.brokers[0]
    assert await tls_lookup(entry, pki, topic, jwt) == ("redirect", https(owner))
    assert await tls_lookup(owner, pki, topic, jwt) == ("connect", https(owner))

    # The official client through the entry broker follows the redirect over TLS, token and all.
    c2 = await secure_client(entry, pki, jwt)
    cons, queue = await consumer(c2, topic, "c", "s")
    p2 = await producer(c2, topic, "p2", reliable=True)
    await p2.send(b"redirected", {})
    got = await take(queue, 1, ack=cons)
    assert [m.payload for m in got] == [b"redirected"]
    await cons.close()

    # The Ister client too (batch API on the owner, found by lookup through the entry broker).
    async with Client(https(entry), token=jwt, tls_ca=str(pki.ca_file)) as ister:
        prod = await ister.producer(topic, "ister-p")
        offset = await prod.send(b"from-ister")
        await prod.close()
        records = [r async for batch in ister.read(topic, offset, offset + 1) for r in batch]
        assert [o for o, _ in records] == [offset]


async def test_plaintext_and_unauthenticated_calls_are_refused_on_every_broker(
    cluster: Cluster, pki: Pki
) -> None:
    for b in cluster.brokers:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{b.port}") as ch:
            with pytest.raises(grpc.aio.AioRpcError) as plain:
                await dpb_grpc.DiscoveryStub(ch).TopicLookup(
                    dpb.TopicLookupRequest(request_id=1, topic="/default/x"), timeout=5
                )
        assert plain.value.code() == grpc.StatusCode.UNAVAILABLE
        creds = grpc.ssl_channel_credentials(pki.ca_file.read_bytes())
        async with grpc.aio.secure_channel(f"127.0.0.1:{b.port}", creds) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as anonymous:
                await dpb_grpc.DiscoveryStub(ch).TopicLookup(
                    dpb.TopicLookupRequest(request_id=1, topic="/default/x"), timeout=5
                )
        assert anonymous.value.code() == grpc.StatusCode.UNAUTHENTICATED

    # The official client in plaintext against the TLS cluster fails rather than hanging.
    async def plaintext_produce() -> None:
        plain_client = await danube.DanubeClientBuilder().service_url(cluster.brokers[0].url).build()
        p = await producer(plain_client, "/default/plain", "p")
        await p.send(b"x", {})

    with pytest.raises(Exception) as refused:  # the client raises its own error or grpc's
        await asyncio.wait_for(plaintext_produce(), WAIT)
    assert not isinstance(refused.value, TimeoutError)
