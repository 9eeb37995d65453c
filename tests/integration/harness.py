"""Start real `ister broker` processes on free loopback ports and drive them like an operator would."""

from __future__ import annotations

import asyncio
import os
import time
import urllib.request
import weakref

import danube
import grpc
from prometheus_client.parser import text_string_to_metric_families

from ister.devcluster.broker import ISTER as ISTER  # re-exported: tests run `ister` with it
from ister.devcluster.broker import BrokerNode
from ister.wire.gen import DanubeAdmin_pb2 as apb
from ister.wire.gen import DanubeAdmin_pb2_grpc as apb_grpc
from tests.integration import forkserver

# Standalone brokers started here, by client URL: `consumer()` asks their admin API when its stream is open.
_ADMIN_OF_URL: dict[str, str] = {}
NETNS_EXEC = ["ip", "netns", "exec"]  # tests/integration/network.py's prefix_command
# Keyed by the client object itself (weakly): an id() could be reused by a later client of another broker.
_ADMIN_OF_CLIENT: weakref.WeakKeyDictionary[danube.DanubeClient, str] = weakref.WeakKeyDictionary()


class BrokerProcess(BrokerNode):
    """One broker subprocess (ister.devcluster.broker), forked from this test process's fork server
    (tests/integration/forkserver.py; into its network namespace when `prefix` is `ip netns exec NS`) unless
    its environment needs an exec (LD_PRELOAD) or forking is turned off. Standalone ones are remembered by
    client URL so `consumer()` can ask their admin API when its stream is open."""

    def launch(self) -> None:
        netns = self.prefix[3] if len(self.prefix) == 4 and self.prefix[:3] == NETNS_EXEC else None
        server = None if self.prefix and netns is None else forkserver.server()
        inherited = {k: v for k, v in os.environ.items() if self.ister_env or not k.startswith("ISTER_")}
        env = {**inherited, **self.env}
        if server is None or not server.forkable(env):
            super().launch()
            return
        self.proc = server.spawn(  # type: ignore[assignment]
            self.args(), env, self.log_path, self.own_session, netns=netns
        )

    def start(self, timeout: float = 30.0) -> None:
        super().start(timeout)
        _ADMIN_OF_URL.pop(self.url, None)  # a port reused from a broker stopped earlier
        if "cluster" not in self.extra:  # in a cluster the topic may be served by another broker
            _ADMIN_OF_URL[self.url] = self.admin_addr

    def stop(self) -> None:
        super().stop()
        _ADMIN_OF_URL.pop(self.url, None)


async def client(url: str) -> danube.DanubeClient:
    c = await danube.DanubeClientBuilder().service_url(url).build()
    if url in _ADMIN_OF_URL:
        _ADMIN_OF_CLIENT[c] = _ADMIN_OF_URL[url]
    return c


async def producer(
    c: danube.DanubeClient, topic: str, name: str, *, reliable: bool = False, partitions: int | None = None
) -> danube.Producer:
    b = c.new_producer().with_topic(topic).with_name(name)
    if reliable:
        b = b.with_dispatch_strategy(danube.DispatchStrategy.RELIABLE)
    if partitions:
        b = b.with_partitions(partitions)
    p = b.build()
    await p.create()
    return p


async def consumer(
    c: danube.DanubeClient,
    topic: str,
    name: str,
    subscription: str,
    sub_type: danube.SubType = danube.SubType.EXCLUSIVE,
    key_filters: list[str] | None = None,
) -> tuple[danube.Consumer, asyncio.Queue]:  # type: ignore[type-arg]
    b = c.new_consumer().with_topic(topic).with_consumer_name(name).with_subscription(subscription)
    b = b.with_subscription_type(sub_type)
    if key_filters:
        b = b.with_key_filters(key_filters)
    cons = b.build()
    await cons.subscribe()
    queue = await cons.receive()
    admin = _ADMIN_OF_CLIENT.get(c)
    if admin is not None:
        # Every partition's stream (the client opens one per partition, each in its own task): the base
        # name of a partitioned topic lists a consumer as soon as one of them is open.
        for partition in cons._consumers:
            await until_attached(admin, partition, subscription, name)
    return cons, queue


async def attached(admin_addr: str, topic: str) -> list[tuple[str, str]]:
    """(subscription, consumer name) of the consumers whose stream is open on that broker."""
    async with grpc.aio.insecure_channel(admin_addr) as channel:
        got = await apb_grpc.TopicAdminStub(channel).DescribeTopic(
            apb.DescribeTopicRequest(name=topic), timeout=10
        )
    return [(a.subscription, a.consumer_name) for a in got.attached_consumers]


async def until_attached(
    admin_addr: str, topic: str, subscription: str, name: str, within: float = 15.0
) -> None:
    """Wait until the broker says the consumer's delivery stream is open (the client opens it in the
    background after `receive()`; a message sent before then would not reach it)."""
    want = apb.AttachedConsumer(subscription=subscription, consumer_name=name)
    deadline = time.monotonic() + within
    async with grpc.aio.insecure_channel(admin_addr) as channel:
        stub = apb_grpc.TopicAdminStub(channel)
        while True:
            got = await stub.DescribeTopic(apb.DescribeTopicRequest(name=topic), timeout=10)
            if want in got.attached_consumers:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"consumer {name} of {subscription} on {topic} never attached: {got}")
            await asyncio.sleep(0.02)


async def take(
    queue: asyncio.Queue,  # type: ignore[type-arg]
    n: int,
    within: float = 15.0,
    ack: danube.Consumer | None = None,
) -> list:  # type: ignore[type-arg]
    """Receive exactly n messages (acking each through `ack` when given) or fail after `within` seconds."""
    out = []
    deadline = time.monotonic() + within
    while len(out) < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"received {len(out)} of {n} messages within {within} s")
        message = await asyncio.wait_for(queue.get(), remaining)
        if ack is not None:
            await ack.ack(message)
        out.append(message)
    return out


async def nothing_within(queue: asyncio.Queue, seconds: float) -> bool:  # type: ignore[type-arg]
    """True when no message arrives within `seconds` (used only to assert absence)."""
    try:
        await asyncio.wait_for(queue.get(), seconds)
    except TimeoutError:
        return True
    return False


def subscription_metric(url: str, name: str, topic: str, sub: str) -> float | None:
    """The value of a (topic, subscription) sample on a broker's Prometheus exporter, None when absent."""
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and s.labels.get("topic") == topic and s.labels.get("subscription") == sub:
                return float(s.value)
    return None


def broker_metric(url: str, name: str, **labels: str) -> float | None:
    """The value of the sample `name` with these labels (others may be there) on a broker's Prometheus
    exporter, None when absent."""
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return None
