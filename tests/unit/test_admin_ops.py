"""The admin API in-process: a standalone BrokerService (metadata in memory, WAL on tmp_path) behind the
danube_admin servicers on a loopback port, called through the generated stubs."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from ister.broker.admin_ops import AdminOps
from ister.broker.service import BrokerService
from ister.config import load_config
from ister.core.dispatch import SubType
from ister.core.record import StoredMessage
from ister.errors import FailedPrecondition
from ister.ids import TopicName
from ister.metadata import keys
from ister.metadata.embedded import EmbeddedStore
from ister.server.admin_api import add_admin_services, start_admin_server
from ister.server.health_api import health_pb
from ister.wire.gen import DanubeAdmin_pb2 as pb
from ister.wire.gen import DanubeAdmin_pb2_grpc as pb_grpc

Code = grpc.StatusCode


class Admin:
    def __init__(self, broker: BrokerService, ops: AdminOps, channel: grpc.aio.Channel) -> None:
        self.broker = broker
        self.ops = ops
        self.topics = pb_grpc.TopicAdminStub(channel)
        self.namespaces = pb_grpc.NamespaceAdminStub(channel)
        self.brokers = pb_grpc.BrokerAdminStub(channel)
        self.cluster = pb_grpc.ClusterAdminStub(channel)
        self.security = pb_grpc.SecurityAdminStub(channel)


@pytest.fixture
async def admin(tmp_path: Path) -> AsyncIterator[Admin]:
    store = EmbeddedStore.in_memory()
    broker = BrokerService(load_config(environ={}), store, tmp_path)
    await broker.start()
    server = grpc.aio.server()
    ops = add_admin_services(server, broker)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield Admin(broker, ops, channel)
    finally:
        await channel.close()
        await server.stop(None)
        await broker.close()
        await store.close()


async def status_of(call: Any) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value.code()


async def create(a: Admin, name: str, *, reliable: bool = False) -> None:
    strategy = pb.Reliable if reliable else pb.NonReliable
    assert (await a.topics.CreateTopic(pb.NewTopicRequest(name=name, dispatch_strategy=strategy))).success


async def topic_keys(a: Admin, name: str) -> list[str]:
    t = TopicName.parse(name)
    found = [kv.key for kv in await a.broker.store.list(keys.topic_prefix(t))]
    for key in (keys.topic_root(t), keys.namespace_topic(t), keys.owner(t), keys.unassigned(t)):
        if await a.broker.store.get(key) is not None:
            found.append(key)
    return found


def _msg(payload: bytes) -> StoredMessage:
    return StoredMessage(payload=payload, publish_time=1, producer_id=1, producer_name="p")


# -- topics: create, list, describe ---------------------------------------------------------------------


async def test_create_topic_loads_it_and_lists_it(admin: Admin) -> None:
    await create(admin, "/default/orders", reliable=True)
    await create(admin, "/default/events")
    assert "/default/orders" in admin.broker.topics  # standalone: loaded at once
    listed = await admin.topics.ListNamespaceTopics(pb.NamespaceRequest(name="default"))
    assert [(t.name, t.broker_id, t.delivery) for t in listed.topics] == [
        ("/default/events", "0", "NonReliable"),
        ("/default/orders", "0", "Reliable"),
    ]
    d = await admin.topics.DescribeTopic(pb.DescribeTopicRequest(name="/default/orders"))
    assert (d.name, d.broker_id, d.delivery, list(d.subscriptions)) == (
        "/default/orders",
        "0",
        "Reliable",
        [],
    )
    assert not d.HasField("schema_subject")
    names = await admin.namespaces.GetNamespaceTopics(pb.NamespaceRequest(name="default"))
    assert list(names.topics) == ["default/events", "default/orders"]  # Danube's form, no leading slash


async def test_create_topic_status_codes(admin: Admin) -> None:
    await create(admin, "/default/t")
    req = pb.NewTopicRequest
    assert await status_of(admin.topics.CreateTopic(req(name="/default/t"))) == Code.ALREADY_EXISTS
    assert await status_of(admin.topics.CreateTopic(req(name="/nope/t"))) == Code.NOT_FOUND
    for bad in ("default/t", "/default/a/b", "/default/", "/default/sp ace", ""):
        assert await status_of(admin.topics.CreateTopic(req(name=bad))) == Code.INVALID_ARGUMENT, bad
    assert await status_of(admin.topics.CreateTopic(req(name="/default/x-part-0"))) == Code.INVALID_ARGUMENT
    assert (
        await status_of(admin.topics.CreateTopic(req(name="/default/" + "x" * 253))) == Code.INVALID_ARGUMENT
    )
    with_schema = req(name="/default/s", schema_subject="subj")  # a subject nobody registered (issue 17)
    assert await status_of(admin.topics.CreateTopic(with_schema)) == Code.NOT_FOUND
    await create(admin, "/default/s")  # the refused call created nothing


async def test_create_topic_works_with_auto_create_off(tmp_path: Path) -> None:
    store = EmbeddedStore.in_memory()
    broker = BrokerService(load_config(environ={"ISTER_AUTO_CREATE_TOPICS": "false"}), store, tmp_path)
    await broker.start()
    try:
        await AdminOps(broker).create_topic("/default/t", reliable=True)
        assert broker.topics["/default/t"].delivery == "Reliable"
    finally:
        await broker.close()
        await store.close()


async def test_partitioned_topic(admin: Admin) -> None:
    req = pb.PartitionedTopicRequest(base_name="/default/p", partitions=3, dispatch_strategy=pb.Reliable)
    assert (await admin.topics.CreatePartitionedTopic(req)).success
    listed = await admin.topics.ListNamespaceTopics(pb.NamespaceRequest(name="default"))
    assert [t.name for t in listed.topics] == ["/default/p-part-0", "/default/p-part-1", "/default/p-part-2"]
    assert await status_of(admin.topics.CreatePartitionedTopic(req)) == Code.ALREADY_EXISTS
    plain = pb.NewTopicRequest(name="/default/p")
    assert await status_of(admin.topics.CreateTopic(plain)) == Code.ALREADY_EXISTS
    for n in (0, 1001):
        bad = pb.PartitionedTopicRequest(base_name="/default/q", partitions=n)
        assert await status_of(admin.topics.CreatePartitionedTopic(bad)) == Code.INVALID_ARGUMENT
    await create(admin, "/default/plain")
    over_plain = pb.PartitionedTopicRequest(base_name="/default/plain", partitions=2)
    assert await status_of(admin.topics.CreatePartitionedTopic(over_plain)) == Code.ALREADY_EXISTS
    d = await admin.topics.DescribeTopic(pb.DescribeTopicRequest(name="/default/p"))
    assert (d.name, d.broker_id, d.delivery) == ("/default/p", "0", "Reliable")
    described = await admin.ops.describe_topic("/default/p")
    assert described.partitions == ["/default/p-part-0", "/default/p-part-1", "/default/p-part-2"]


async def test_names_are_matched_exactly(admin: Admin) -> None:
    """`/default/foo` is not `/default/foobar` nor a partition of it (Danube's prefix/substring quirks)."""
    await create(admin, "/default/foobar")
    await admin.broker.subscribe("/default/foobar", "s-bar", "c", SubType.SHARED, [])
    assert await status_of(admin.topics.DescribeTopic(pb.DescribeTopicRequest(name="/default/foo"))) == (
        Code.NOT_FOUND
    )
    await create(admin, "/default/foo")
    await admin.topics.CreatePartitionedTopic(
        pb.PartitionedTopicRequest(base_name="/default/foob", partitions=1)
    )
    subs = await admin.topics.ListSubscriptions(pb.TopicRequest(name="/default/foo"))
    assert list(subs.subscriptions) == []
    assert (await admin.topics.DeleteTopic(pb.TopicRequest(name="/default/foo"))).success
    listed = await admin.topics.ListNamespaceTopics(pb.NamespaceRequest(name="default"))
    assert [t.name for t in listed.topics] == ["/default/foob-part-0", "/default/foobar"]


# -- topics: delete -------------------------------------------------------------------------------------


async def test_delete_topic_removes_every_trace(admin: Admin, tmp_path: Path) -> None:
    b = admin.broker
    await create(admin, "/default/gone", reliable=True)
    pid = await b.create_producer("/default/gone", "p", reliable=True, access_mode=0)
    session = await b.producer(pid, "/default/gone")
    cid = await b.subscribe("/default/gone", "sub", "c", SubType.SHARED, [])
    for i in range(3):
        await b.send(session, _msg(b"old-%d" % i))
    await b.store.put(keys.subscription_cursor("/default/gone", "sub"), 1)
    assert (tmp_path / "wal" / "default" / "gone").exists()
    assert b.objects is not None  # standalone default: file://<data_dir>/objects
    await b.objects.put("default/gone/data-0-2.dnb1", b"x")  # as if exported
    await b.objects.put("default/gone2/data-0-0.dnb1", b"y")  # a neighbour's
    assert (await admin.topics.DeleteTopic(pb.TopicRequest(name="/default/gone"))).success
    assert "/default/gone" not in b.topics
    assert pid not in b.producers and cid not in b.consumers
    assert await topic_keys(admin, "/default/gone") == []
    assert await b.store.get(keys.consumer_index(cid)) is None
    assert not (tmp_path / "wal" / "default" / "gone").exists()
    assert [o.key for o in await b.objects.list("default/")] == ["default/gone2/data-0-0.dnb1"]
    assert await status_of(admin.topics.DescribeTopic(pb.DescribeTopicRequest(name="/default/gone"))) == (
        Code.NOT_FOUND
    )
    # The same name again is a new, empty topic: nothing of the old one comes back.
    await create(admin, "/default/gone", reliable=True)
    topic = b.topics["/default/gone"]
    assert topic.wal is not None and topic.wal.next_offset == 0
    assert await admin.ops.list_subscriptions("/default/gone") == []


async def test_delete_status_codes_and_partitions(admin: Admin) -> None:
    assert await status_of(admin.topics.DeleteTopic(pb.TopicRequest(name="/default/none"))) == Code.NOT_FOUND
    assert await status_of(admin.topics.DeleteTopic(pb.TopicRequest(name="/nope/none"))) == Code.NOT_FOUND
    assert await status_of(admin.topics.DeleteTopic(pb.TopicRequest(name="bad"))) == Code.INVALID_ARGUMENT
    await admin.topics.CreatePartitionedTopic(
        pb.PartitionedTopicRequest(base_name="/default/p", partitions=2)
    )
    part = pb.TopicRequest(name="/default/p-part-1")
    assert await status_of(admin.topics.DeleteTopic(part)) == Code.INVALID_ARGUMENT
    assert await admin.ops.delete_topic("/default/p") == ["/default/p-part-0", "/default/p-part-1"]
    listed = await admin.topics.ListNamespaceTopics(pb.NamespaceRequest(name="default"))
    assert list(listed.topics) == []
    assert not admin.broker.topics


# -- subscriptions --------------------------------------------------------------------------------------


async def test_list_subscriptions_unique_and_sorted(admin: Admin) -> None:
    await create(admin, "/default/t", reliable=True)
    for sub in ("zeta", "alpha", "mid"):
        await admin.broker.subscribe("/default/t", sub, "c-" + sub, SubType.SHARED, [])
    store = admin.broker.store
    await store.put(keys.subscription_cursor("/default/t", "alpha"), 5)
    await store.put(keys.subscription_dispatch_config("/default/t", "alpha"), {"max_unacked_messages": 3})
    got = await admin.topics.ListSubscriptions(pb.TopicRequest(name="/default/t"))
    assert list(got.subscriptions) == ["alpha", "mid", "zeta"]
    d = await admin.topics.DescribeTopic(pb.DescribeTopicRequest(name="/default/t"))
    assert list(d.subscriptions) == ["alpha", "mid", "zeta"]
    missing = pb.TopicRequest(name="/default/missing")
    assert await status_of(admin.topics.ListSubscriptions(missing)) == Code.NOT_FOUND


async def test_unsubscribe_refuses_active_consumers(admin: Admin) -> None:
    b = admin.broker
    await create(admin, "/default/t", reliable=True)
    cid = await b.subscribe("/default/t", "s", "c", SubType.EXCLUSIVE, [])
    await b.store.put(keys.subscription_cursor("/default/t", "s"), 0)
    ref, stream = await b.open_stream(cid)
    req = pb.SubscriptionRequest(topic="/default/t", subscription="s")
    assert await status_of(admin.topics.Unsubscribe(req)) == Code.FAILED_PRECONDITION
    b.close_stream(ref, stream)
    assert (await admin.topics.Unsubscribe(req)).success
    assert "s" not in b.topics["/default/t"].subscriptions
    assert cid not in b.consumers
    assert await b.store.list(keys.subscriptions_prefix("/default/t")) == []
    assert await b.store.get(keys.consumer_index(cid)) is None
    assert await status_of(admin.topics.Unsubscribe(req)) == Code.NOT_FOUND
    bad = pb.SubscriptionRequest(topic="/default/t", subscription="a/b")
    assert await status_of(admin.topics.Unsubscribe(bad)) == Code.INVALID_ARGUMENT
    # A consumer may subscribe again afterwards: a fresh subscription.
    await b.subscribe("/default/t", "s", "c", SubType.EXCLUSIVE, [])


async def test_unsubscribe_of_a_topic_not_loaded(admin: Admin) -> None:
    b = admin.broker
    await create(admin, "/default/t", reliable=True)
    await b.subscribe("/default/t", "s", "c", SubType.SHARED, [])
    await b.unload("/default/t", "test")
    assert (
        await admin.topics.Unsubscribe(pb.SubscriptionRequest(topic="/default/t", subscription="s"))
    ).success
    assert await b.store.list(keys.subscriptions_prefix("/default/t")) == []


def _policy(**over: Any) -> pb.SubscriptionFailurePolicy:
    fields: dict[str, Any] = {
        "max_redelivery_count": 3,
        "ack_timeout_ms": 5000,
        "base_redelivery_delay_ms": 100,
        "max_redelivery_delay_ms": 1000,
        "backoff_strategy": pb.Fixed,
        "poison_policy": pb.Drop,
    }
    fields.update(over)
    return pb.SubscriptionFailurePolicy(**fields)


async def test_failure_policy(admin: Admin) -> None:
    await create(admin, "/default/r", reliable=True)
    await create(admin, "/default/n")
    await admin.broker.subscribe("/default/r", "s", "c", SubType.FAILOVER, [])
    set_ = admin.topics.SetSubscriptionFailurePolicy
    req = pb.SetSubscriptionFailurePolicyRequest
    assert await status_of(set_(req(topic="/default/n", subscription="s", failure_policy=_policy()))) == (
        Code.FAILED_PRECONDITION
    )
    no_dlq = _policy(poison_policy=pb.DeadLetter)
    assert await status_of(set_(req(topic="/default/r", subscription="s", failure_policy=no_dlq))) == (
        Code.INVALID_ARGUMENT
    )
    zero = _policy(ack_timeout_ms=0)
    assert await status_of(set_(req(topic="/default/r", subscription="s", failure_policy=zero))) == (
        Code.INVALID_ARGUMENT
    )
    assert await status_of(set_(req(topic="/default/r", subscription="s"))) == Code.INVALID_ARGUMENT
    missing = req(topic="/default/x", subscription="s", failure_policy=_policy())
    assert await status_of(set_(missing)) == Code.NOT_FOUND
    good = _policy(
        poison_policy=pb.DeadLetter, dead_letter_topic="/default/r-dead", backoff_strategy=pb.Exponential
    )
    assert (await set_(req(topic="/default/r", subscription="s", failure_policy=good))).success
    stored = await admin.broker.store.get(keys.subscription_failure_policy("/default/r", "s"))
    assert stored is not None and stored.value == {
        "max_redelivery_count": 3,
        "ack_timeout_ms": 5000,
        "base_redelivery_delay_ms": 100,
        "max_redelivery_delay_ms": 1000,
        "backoff_strategy": "Exponential",
        "dead_letter_topic": "/default/r-dead",
        "poison_policy": "DeadLetter",
    }
    got = await admin.topics.GetSubscriptionFailurePolicy(
        pb.GetSubscriptionFailurePolicyRequest(topic="/default/r", subscription="s")
    )
    assert got.subscription_type == int(SubType.FAILOVER)
    assert got.HasField("failure_policy") and got.failure_policy == good
    unknown = pb.GetSubscriptionFailurePolicyRequest(topic="/default/r", subscription="other")
    assert await status_of(admin.topics.GetSubscriptionFailurePolicy(unknown)) == Code.NOT_FOUND


async def test_dispatch_config(admin: Admin) -> None:
    await create(admin, "/default/r", reliable=True)
    await create(admin, "/default/n")
    await admin.broker.subscribe("/default/r", "s", "c", SubType.SHARED, [])
    req = pb.SetSubscriptionDispatchConfigRequest
    cfg = pb.SubscriptionDispatchConfig
    for bad in (0, 10_001):
        call = admin.topics.SetSubscriptionDispatchConfig(
            req(topic="/default/r", subscription="s", dispatch_config=cfg(max_unacked_messages=bad))
        )
        assert await status_of(call) == Code.INVALID_ARGUMENT
    nonrel = req(topic="/default/n", subscription="s", dispatch_config=cfg(max_unacked_messages=5))
    assert await status_of(admin.topics.SetSubscriptionDispatchConfig(nonrel)) == Code.FAILED_PRECONDITION
    get = pb.GetSubscriptionDispatchConfigRequest(topic="/default/r", subscription="s")
    assert not (await admin.topics.GetSubscriptionDispatchConfig(get)).HasField("dispatch_config")
    ok = req(topic="/default/r", subscription="s", dispatch_config=cfg(max_unacked_messages=42))
    assert (await admin.topics.SetSubscriptionDispatchConfig(ok)).success
    assert (await admin.topics.GetSubscriptionDispatchConfig(get)).dispatch_config.max_unacked_messages == 42
    assert (
        admin.broker.topics["/default/r"].subscriptions["s"].window == 42
    )  # applied to the open subscription
    unknown = pb.GetSubscriptionDispatchConfigRequest(topic="/default/r", subscription="nobody")
    assert await status_of(admin.topics.GetSubscriptionDispatchConfig(unknown)) == Code.NOT_FOUND


# -- unload ---------------------------------------------------------------------------------------------


async def test_unload_calls_the_broker(admin: Admin, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[TopicName] = []

    async def request_unload(name: TopicName) -> None:
        calls.append(name)

    monkeypatch.setattr(admin.broker, "request_unload", request_unload, raising=False)
    await create(admin, "/default/t")
    await admin.topics.CreatePartitionedTopic(
        pb.PartitionedTopicRequest(base_name="/default/p", partitions=2)
    )
    assert (await admin.topics.UnloadTopic(pb.TopicRequest(name="/default/t"))).success
    assert (await admin.topics.UnloadTopic(pb.TopicRequest(name="/default/p"))).success
    assert [c.full for c in calls] == ["/default/t", "/default/p-part-0", "/default/p-part-1"]
    assert await status_of(admin.topics.UnloadTopic(pb.TopicRequest(name="/default/x"))) == Code.NOT_FOUND


# -- namespaces -----------------------------------------------------------------------------------------


async def test_namespaces(admin: Admin) -> None:
    ns = admin.namespaces
    assert list((await admin.brokers.ListNamespaces(pb.Empty())).namespaces) == ["default"]
    assert (await ns.CreateNamespace(pb.NamespaceRequest(name="team-a"))).success
    assert await status_of(ns.CreateNamespace(pb.NamespaceRequest(name="team-a"))) == Code.ALREADY_EXISTS
    assert await status_of(ns.CreateNamespace(pb.NamespaceRequest(name="a/b"))) == Code.INVALID_ARGUMENT
    assert await status_of(ns.CreateNamespace(pb.NamespaceRequest(name=""))) == Code.INVALID_ARGUMENT
    await create(admin, "/team-a/t1")
    await create(admin, "/team-a/t2")
    assert list((await admin.brokers.ListNamespaces(pb.Empty())).namespaces) == ["default", "team-a"]
    policies = json.loads((await ns.GetNamespacePolicies(pb.NamespaceRequest(name="team-a"))).policies)
    assert policies["max_message_size"] == 10 * 1024 * 1024 and policies["max_producers_per_topic"] == 0
    missing = pb.NamespaceRequest(name="nope")
    assert await status_of(ns.GetNamespacePolicies(missing)) == Code.NOT_FOUND
    assert await status_of(ns.GetNamespaceTopics(missing)) == Code.NOT_FOUND
    assert await status_of(admin.topics.ListNamespaceTopics(missing)) == Code.NOT_FOUND
    assert await status_of(ns.DeleteNamespace(missing)) == Code.NOT_FOUND
    assert await status_of(ns.DeleteNamespace(pb.NamespaceRequest(name="team-a"))) == Code.FAILED_PRECONDITION
    await admin.ops.delete_topic("/team-a/t1")
    await admin.ops.delete_topic("/team-a/t2")
    assert (await ns.DeleteNamespace(pb.NamespaceRequest(name="team-a"))).success
    assert list((await admin.brokers.ListNamespaces(pb.Empty())).namespaces) == ["default"]
    assert await admin.broker.store.list(keys.namespace_prefix("team-a")) == []


# -- brokers --------------------------------------------------------------------------------------------


async def test_brokers_standalone(admin: Admin) -> None:
    brokers = (await admin.brokers.ListBrokers(pb.Empty())).brokers
    assert len(brokers) == 1
    b = brokers[0]
    assert (b.broker_id, b.broker_addr, b.admin_addr, b.broker_role, b.broker_status) == (
        "0",
        "http://127.0.0.1:6650",
        "http://127.0.0.1:50051",
        "Cluster_Leader",
        "active",
    )
    assert b.metrics_addr == "127.0.0.1:9040"
    assert (await admin.brokers.GetLeaderBroker(pb.Empty())).leader == "0"
    await create(admin, "/default/t")
    await admin.namespaces.CreateNamespace(pb.NamespaceRequest(name="other"))
    await create(admin, "/other/u")
    listed = await admin.topics.ListBrokerTopics(pb.BrokerRequest(broker_id="0"))
    assert [(t.name, t.broker_id) for t in listed.topics] == [("/default/t", "0"), ("/other/u", "0")]
    assert await status_of(admin.topics.ListBrokerTopics(pb.BrokerRequest(broker_id="7"))) == Code.NOT_FOUND
    for bad in ("abc", "-1", "", "01", str(2**64)):
        got = await status_of(admin.topics.ListBrokerTopics(pb.BrokerRequest(broker_id=bad)))
        assert got == Code.INVALID_ARGUMENT, bad


# -- what Ister does not implement, and the server itself ------------------------------------------------


async def test_unimplemented_rpcs_say_so(admin: Admin) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await admin.cluster.ClusterStatus(pb.Empty())
    assert info.value.code() == Code.UNIMPLEMENTED
    assert "not implemented" in (info.value.details() or "")


async def test_security_admin_roles_and_bindings(admin: Admin) -> None:
    """SecurityAdmin works with security off too (roles are prepared before turning it on)."""
    role = pb.RoleDefinition(name="producer", permissions=["Produce", "Lookup"])
    assert (await admin.security.CreateRole(pb.CreateRoleRequest(role=role))).success
    listed = await admin.security.ListRoles(pb.Empty())
    assert [(r.name, list(r.permissions)) for r in listed.roles] == [("producer", ["Produce", "Lookup"])]
    bad = pb.RoleDefinition(name="x", permissions=["Fly"])
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await admin.security.CreateRole(pb.CreateRoleRequest(role=bad))
    assert info.value.code() == Code.INVALID_ARGUMENT
    binding = pb.BindingDefinition(
        id="b1",
        principal_type="service_account",
        principal_name="app",
        role_names=["producer"],
        scope="namespace",
        resource_name="default",
    )
    assert (await admin.security.CreateBinding(pb.CreateBindingRequest(binding=binding))).success
    got = await admin.security.GetBinding(
        pb.GetBindingRequest(scope="namespace", resource_name="default", binding_id="b1")
    )
    assert got.binding.principal_name == "app"
    assert len((await admin.security.ListAllBindings(pb.Empty())).bindings) == 1
    await admin.security.DeleteBinding(
        pb.DeleteBindingRequest(scope="namespace", resource_name="default", binding_id="b1")
    )
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await admin.security.GetBinding(
            pb.GetBindingRequest(scope="namespace", resource_name="default", binding_id="b1")
        )
    assert info.value.code() == Code.NOT_FOUND
    await admin.security.DeleteRole(pb.DeleteRoleRequest(name="producer"))
    assert not (await admin.security.ListRoles(pb.Empty())).roles


async def test_drain_and_rebalance_need_cluster_mode(admin: Admin) -> None:
    for call in (
        admin.brokers.UnloadBroker(pb.UnloadBrokerRequest(broker_id="1")),
        admin.brokers.ActivateBroker(pb.ActivateBrokerRequest(broker_id="1")),
        admin.brokers.GetClusterBalance(pb.ClusterBalanceRequest()),
        admin.brokers.TriggerRebalance(pb.RebalanceRequest()),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call
        assert info.value.code() == Code.FAILED_PRECONDITION
        assert "cluster mode" in (info.value.details() or "")
    # Ister's broker load view (IsterAdmin.ListBrokerLoads) reads the same cluster-only reports.
    with pytest.raises(FailedPrecondition, match="cluster mode"):
        await admin.ops.placement_admin.load_reports()


async def test_cluster_health_on_a_standalone_broker_says_what_applies(admin: Admin) -> None:
    await create(admin, "/default/one", reliable=True)
    health = health_pb(await admin.ops.placement_admin.cluster_health(0))  # as GetClusterHealth answers
    assert health.mode == "standalone" and "cluster mode only" in health.note
    assert not health.moves and not health.failed_moves and health.replicated_topics == 0
    assert not health.under_replicated and not health.under_min_isr


async def test_start_admin_server_and_bind_errors(tmp_path: Path) -> None:
    store = EmbeddedStore.in_memory()
    broker = BrokerService(load_config(environ={}), store, tmp_path)
    await broker.start()
    probe = grpc.aio.server()
    port = probe.add_insecure_port("127.0.0.1:0")
    await probe.start()
    try:
        with pytest.raises(OSError, match="admin_addr"):
            await start_admin_server(broker, f"127.0.0.1:{port}")  # taken
        await probe.stop(None)
        server = await start_admin_server(broker, f"127.0.0.1:{port}")
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                leader = await pb_grpc.BrokerAdminStub(channel).GetLeaderBroker(pb.Empty())
                assert leader.leader == "0"
        finally:
            await server.stop(None)
    finally:
        await probe.stop(None)
        await broker.close()
        await store.close()


async def test_unload_standalone_seals_and_reloads(admin: Admin) -> None:
    b = admin.broker
    await create(admin, "/default/u", reliable=True)
    pid = await b.create_producer("/default/u", "p", reliable=True, access_mode=0)
    session = await b.producer(pid, "/default/u")
    for i in range(3):
        await b.send(session, _msg(b"%d" % i))
    assert (await admin.topics.UnloadTopic(pb.TopicRequest(name="/default/u"))).success
    assert "/default/u" not in b.topics
    topic = await b.get_topic(TopicName.parse("/default/u"))  # next use reloads it where it left off
    assert topic.wal is not None and topic.wal.next_offset == 3
