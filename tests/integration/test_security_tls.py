"""TLS and mutual TLS on the client and admin ports, with the official danube-client (with_tls,
with_mtls), plaintext refused cleanly, and certificates rotated while producing."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import danube
import grpc
import pytest
from danube.proto import DanubeApi_pb2 as pb
from danube.proto import DanubeApi_pb2_grpc as pb_grpc

from ister.wire.gen import DanubeAdmin_pb2 as apb
from ister.wire.gen import DanubeAdmin_pb2_grpc as apb_grpc
from tests.integration.harness import BrokerProcess, consumer, producer, take
from tests.integration.security_support import Pki, make_pki
from tests.support import until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(
        tmp_path_factory.mktemp("tls") / "data",
        "--tls-cert",
        str(pki.cert_file),
        "--tls-key",
        str(pki.key_file),
    )
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture(scope="module")
def mtls_broker(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(
        tmp_path_factory.mktemp("mtls") / "data",
        *("--tls-cert", str(pki.cert_file), "--tls-key", str(pki.key_file)),
        *("--tls-client-ca", str(pki.ca_file)),
        *("--superuser", "alice"),  # a verified certificate names its principal (CN): alice may do anything
    )
    broker.start()
    yield broker
    broker.stop()


async def _roundtrip(client: danube.DanubeClient, topic: str, n: int = 5) -> list[bytes]:
    prod = await producer(client, topic, "p", reliable=True)
    cons, queue = await consumer(client, topic, "c", "s", danube.SubType.SHARED)
    for i in range(n):
        await prod.send(f"m{i}".encode(), None)
    got = await take(queue, n, ack=cons)
    await cons.close()
    return [m.payload for m in got]


async def test_official_client_with_tls_produces_and_consumes(tls_broker: BrokerProcess, pki: Pki) -> None:
    url = f"https://127.0.0.1:{tls_broker.port}"
    client = await danube.DanubeClientBuilder().service_url(url).with_tls(str(pki.ca_file)).build()
    assert await _roundtrip(client, "/default/tls_roundtrip") == [f"m{i}".encode() for i in range(5)]


async def test_lookup_advertises_https(tls_broker: BrokerProcess, pki: Pki) -> None:
    creds = grpc.ssl_channel_credentials(pki.ca_file.read_bytes())
    async with grpc.aio.secure_channel(f"127.0.0.1:{tls_broker.port}", creds) as ch:
        stub = pb_grpc.ProducerServiceStub(ch)
        await stub.CreateProducer(
            pb.ProducerRequest(request_id=1, producer_name="x", topic_name="/default/adv")
        )
        resp = await pb_grpc.DiscoveryStub(ch).TopicLookup(
            pb.TopicLookupRequest(request_id=2, topic="/default/adv")
        )
    assert resp.broker_url.startswith("https://")


async def test_admin_port_serves_tls(tls_broker: BrokerProcess, pki: Pki) -> None:
    creds = grpc.ssl_channel_credentials(pki.ca_file.read_bytes())
    async with grpc.aio.secure_channel(tls_broker.admin_addr, creds) as ch:
        resp = await apb_grpc.BrokerAdminStub(ch).ListNamespaces(apb.Empty(), timeout=10)
    assert "default" in list(resp.namespaces)


async def test_plaintext_client_against_tls_port_fails_cleanly(tls_broker: BrokerProcess) -> None:
    for addr in (f"127.0.0.1:{tls_broker.port}", tls_broker.admin_addr):
        started = time.monotonic()
        async with grpc.aio.insecure_channel(addr) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await pb_grpc.DiscoveryStub(ch).TopicLookup(
                    pb.TopicLookupRequest(topic="/default/x"), timeout=5
                )
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert time.monotonic() - started < 5  # refused at the handshake, not left to time out
    assert tls_broker.proc is not None and tls_broker.proc.poll() is None  # the broker is fine


async def test_mtls_official_client_with_certificate(mtls_broker: BrokerProcess, pki: Pki) -> None:
    cert, key = pki.client("alice")
    url = f"https://127.0.0.1:{mtls_broker.port}"
    client = await (
        danube.DanubeClientBuilder().service_url(url).with_mtls(str(pki.ca_file), str(cert), str(key)).build()
    )
    assert len(await _roundtrip(client, "/default/mtls_roundtrip", 3)) == 3


async def test_mtls_identity_without_roles_is_denied(mtls_broker: BrokerProcess, pki: Pki) -> None:
    cert, key = pki.client("bob")
    creds = grpc.ssl_channel_credentials(pki.ca_file.read_bytes(), key.read_bytes(), cert.read_bytes())
    async with grpc.aio.secure_channel(f"127.0.0.1:{mtls_broker.port}", creds) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await pb_grpc.DiscoveryStub(ch).TopicLookup(pb.TopicLookupRequest(topic="/default/x"), timeout=5)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "service_account:bob" in (err.value.details() or "")


async def test_mtls_refuses_a_client_without_certificate(
    mtls_broker: BrokerProcess, pki: Pki, tmp_path: Path
) -> None:
    creds = grpc.ssl_channel_credentials(pki.ca_file.read_bytes())
    async with grpc.aio.secure_channel(f"127.0.0.1:{mtls_broker.port}", creds) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await pb_grpc.DiscoveryStub(ch).TopicLookup(pb.TopicLookupRequest(topic="/default/x"), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    other = make_pki(tmp_path / "other", "stranger")  # a certificate from a CA the broker does not trust
    cert, key = other.client("mallory")
    creds = grpc.ssl_channel_credentials(pki.ca_file.read_bytes(), key.read_bytes(), cert.read_bytes())
    async with grpc.aio.secure_channel(f"127.0.0.1:{mtls_broker.port}", creds) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await pb_grpc.DiscoveryStub(ch).TopicLookup(pb.TopicLookupRequest(topic="/default/x"), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_certificate_rotation_while_producing_loses_nothing(tmp_path: Path) -> None:
    first = make_pki(tmp_path / "a", "broker")
    second = make_pki(tmp_path / "b", "broker")
    live_cert, live_key = tmp_path / "live.pem", tmp_path / "live.key"
    shutil.copy(first.cert_file, live_cert)
    shutil.copy(first.key_file, live_key)
    broker = BrokerProcess(tmp_path / "data", "--tls-cert", str(live_cert), "--tls-key", str(live_key))
    broker.start()
    try:
        url = f"https://127.0.0.1:{broker.port}"
        client = await danube.DanubeClientBuilder().service_url(url).with_tls(str(first.ca_file)).build()
        topic = "/default/rotation"
        prod = await producer(client, topic, "p", reliable=True)
        cons, queue = await consumer(client, topic, "c", "s", danube.SubType.SHARED)
        sent = 0
        stop = asyncio.Event()

        async def produce() -> None:
            nonlocal sent
            while not stop.is_set():
                await prod.send(f"m{sent}".encode(), None)
                sent += 1

        task = asyncio.create_task(produce())
        await until(lambda: sent >= 20, "producing before the rotation", 15)
        # Rotate to a certificate of another CA: key then certificate, as a deploy tool would (the
        # half-written pair in between is refused and the old certificate kept).
        shutil.copy(second.key_file, live_key)
        shutil.copy(second.cert_file, live_cert)

        async def connects(pki: Pki) -> bool:
            creds = grpc.ssl_channel_credentials(pki.ca_file.read_bytes())
            async with grpc.aio.secure_channel(f"127.0.0.1:{broker.port}", creds) as ch:
                try:
                    await pb_grpc.DiscoveryStub(ch).TopicLookup(pb.TopicLookupRequest(topic=topic), timeout=3)
                except grpc.aio.AioRpcError:
                    return False
            return True

        await until(lambda: connects(second), "a client trusting only the new CA connects", 20)
        assert not await connects(first)  # new connections get the new certificate
        at_rotation = sent
        await until(lambda: sent >= at_rotation + 20, "producing after the rotation", 15)
        stop.set()
        await task
        # Every acknowledged message reaches the consumer, over its connection opened before the rotation.
        got = await take(queue, sent, ack=cons)
        assert sorted(m.payload for m in got) == sorted(f"m{i}".encode() for i in range(sent))
        assert "certificate reloaded" in broker.log()
        await cons.close()
    finally:
        broker.stop()
