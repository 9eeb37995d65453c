"""Servicers of the Danube admin contract (package `danube_admin`) and the admin gRPC server (port 50051).

The RPCs call `AdminOps`; errors map to gRPC statuses through the same decorator as the client API. RPCs
Ister does not implement (Raft membership, security, broker drain and rebalancing) answer UNIMPLEMENTED with
a message saying so. Behaviour and status codes: docs/admin.md.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc

from ister.broker.admin_ops import NO_LEADER, AdminOps, SubscriptionPolicy, TopicInfo, policies_json
from ister.broker.service import BrokerService
from ister.cluster.balancer import set_broker_mode
from ister.config import split_host_port
from ister.core.cluster.load import imbalance, rank
from ister.core.cluster.planner import ACTIVE, DRAINED, DRAINING
from ister.core.cluster.rebalance import Move
from ister.core.dispatch import FailurePolicy
from ister.core.dispatch.policy import BackoffStrategy, PoisonPolicy
from ister.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable
from ister.ids import shown
from ister.metadata import keys
from ister.server.errors import unary
from ister.server.handlers import add_service
from ister.server.schema_api import add_schema_service, create_with_subject
from ister.wire.enums import reliable_from_wire
from ister.wire.gen import DanubeAdmin_pb2 as pb
from ister.wire.gen import DanubeAdmin_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from ister.cluster.node import ClusterNode

Ctx = Any  # grpc.aio.ServicerContext (untyped library)

ADMIN_SERVER_OPTIONS = [
    ("grpc.so_reuseport", 0),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
]

_BACKOFF_TO_WIRE: dict[BackoffStrategy, Any] = {"Fixed": pb.Fixed, "Exponential": pb.Exponential}
_BACKOFF_FROM_WIRE = {v: k for k, v in _BACKOFF_TO_WIRE.items()}
_POISON_TO_WIRE: dict[PoisonPolicy, Any] = {"DeadLetter": pb.DeadLetter, "Block": pb.Block, "Drop": pb.Drop}
_POISON_FROM_WIRE = {v: k for k, v in _POISON_TO_WIRE.items()}


def _unimplemented(service: str, method: str, why: str) -> Callable[[Any, Any, Ctx], Awaitable[Any]]:
    async def handler(self: Any, request: Any, context: Ctx) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{service}.{method} is not implemented: {why}")

    handler.__name__ = method
    return handler


def _topic_infos(infos: list[TopicInfo]) -> pb.TopicInfoListResponse:
    return pb.TopicInfoListResponse(
        topics=[
            pb.TopicInfo(
                name=i.name, broker_id="" if i.broker_id is None else str(i.broker_id), delivery=i.delivery
            )
            for i in infos
        ]
    )


def failure_policy_from_wire(p: pb.SubscriptionFailurePolicy) -> FailurePolicy:
    backoff = _BACKOFF_FROM_WIRE.get(p.backoff_strategy)
    poison = _POISON_FROM_WIRE.get(p.poison_policy)
    if backoff is None:
        raise InvalidArgument(f"unknown backoff_strategy {p.backoff_strategy}")
    if poison is None:
        raise InvalidArgument(f"unknown poison_policy {p.poison_policy}")
    return FailurePolicy(
        max_redelivery_count=p.max_redelivery_count,
        ack_timeout_ms=p.ack_timeout_ms,
        base_redelivery_delay_ms=p.base_redelivery_delay_ms,
        max_redelivery_delay_ms=p.max_redelivery_delay_ms,
        backoff=backoff,
        poison_policy=poison,
        dead_letter_topic=p.dead_letter_topic if p.HasField("dead_letter_topic") else None,
    )


def failure_policy_to_wire(policy: FailurePolicy) -> pb.SubscriptionFailurePolicy:
    out = pb.SubscriptionFailurePolicy(
        max_redelivery_count=policy.max_redelivery_count,
        ack_timeout_ms=policy.ack_timeout_ms,
        base_redelivery_delay_ms=policy.base_redelivery_delay_ms,
        max_redelivery_delay_ms=policy.max_redelivery_delay_ms,
        backoff_strategy=_BACKOFF_TO_WIRE[policy.backoff],
        poison_policy=_POISON_TO_WIRE[policy.poison_policy],
    )
    if policy.dead_letter_topic is not None:
        out.dead_letter_topic = policy.dead_letter_topic
    return out


class TopicAdminServicer(pb_grpc.TopicAdminServicer):  # type: ignore[misc]
    def __init__(self, ops: AdminOps) -> None:
        self.ops = ops

    @unary
    async def ListNamespaceTopics(
        self, request: pb.NamespaceRequest, context: Ctx
    ) -> pb.TopicInfoListResponse:
        return _topic_infos(await self.ops.list_namespace_topics(request.name))

    @unary
    async def ListBrokerTopics(self, request: pb.BrokerRequest, context: Ctx) -> pb.TopicInfoListResponse:
        return _topic_infos(await self.ops.list_broker_topics(request.broker_id))

    @unary
    async def CreateTopic(self, request: pb.NewTopicRequest, context: Ctx) -> pb.TopicResponse:
        subject = request.schema_subject if request.HasField("schema_subject") else ""
        if subject:
            return await create_with_subject(self.ops, request.name, subject, request.dispatch_strategy)
        await self.ops.create_topic(
            request.name, reliable=reliable_from_wire(request.dispatch_strategy, "dispatch_strategy")
        )
        return pb.TopicResponse(success=True)

    @unary
    async def CreatePartitionedTopic(
        self, request: pb.PartitionedTopicRequest, context: Ctx
    ) -> pb.TopicResponse:
        if request.HasField("schema_subject") and request.schema_subject:
            return await create_with_subject(
                self.ops,
                request.base_name,
                request.schema_subject,
                request.dispatch_strategy,
                partitions=request.partitions,
            )
        await self.ops.create_topic(
            request.base_name,
            reliable=reliable_from_wire(request.dispatch_strategy, "dispatch_strategy"),
            partitions=request.partitions,
            schema_subject=request.schema_subject if request.HasField("schema_subject") else None,
        )
        return pb.TopicResponse(success=True)

    @unary
    async def DeleteTopic(self, request: pb.TopicRequest, context: Ctx) -> pb.TopicResponse:
        await self.ops.delete_topic(request.name)
        return pb.TopicResponse(success=True)

    @unary
    async def UnloadTopic(self, request: pb.TopicRequest, context: Ctx) -> pb.TopicResponse:
        await self.ops.unload_topic(request.name)
        return pb.TopicResponse(success=True)

    @unary
    async def ListSubscriptions(self, request: pb.TopicRequest, context: Ctx) -> pb.SubscriptionListResponse:
        return pb.SubscriptionListResponse(subscriptions=await self.ops.list_subscriptions(request.name))

    @unary
    async def Unsubscribe(self, request: pb.SubscriptionRequest, context: Ctx) -> pb.SubscriptionResponse:
        await self.ops.unsubscribe(request.topic, request.subscription)
        return pb.SubscriptionResponse(success=True)

    @unary
    async def DescribeTopic(self, request: pb.DescribeTopicRequest, context: Ctx) -> pb.DescribeTopicResponse:
        d = await self.ops.describe_topic(request.name)
        out = pb.DescribeTopicResponse(
            name=d.name,
            subscriptions=d.subscriptions,
            broker_id="" if d.broker_id is None else str(d.broker_id),
            delivery=d.delivery,
        )
        if d.schema_subject is not None:
            out.schema_subject = d.schema_subject
        return out

    @unary
    async def SetSubscriptionFailurePolicy(
        self, request: pb.SetSubscriptionFailurePolicyRequest, context: Ctx
    ) -> pb.SubscriptionResponse:
        if not request.HasField("failure_policy"):
            raise InvalidArgument("failure_policy is required")
        policy = failure_policy_from_wire(request.failure_policy)
        await self.ops.set_failure_policy(request.topic, request.subscription, policy)
        return pb.SubscriptionResponse(success=True)

    @unary
    async def GetSubscriptionFailurePolicy(
        self, request: pb.GetSubscriptionFailurePolicyRequest, context: Ctx
    ) -> pb.GetSubscriptionFailurePolicyResponse:
        got: SubscriptionPolicy = await self.ops.get_failure_policy(request.topic, request.subscription)
        out = pb.GetSubscriptionFailurePolicyResponse(subscription_type=got.subscription_type)
        if got.failure_policy is not None:
            out.failure_policy.CopyFrom(failure_policy_to_wire(got.failure_policy))
        return out

    @unary
    async def SetSubscriptionDispatchConfig(
        self, request: pb.SetSubscriptionDispatchConfigRequest, context: Ctx
    ) -> pb.SubscriptionResponse:
        if not request.HasField("dispatch_config"):
            raise InvalidArgument("dispatch_config is required")
        await self.ops.set_dispatch_window(
            request.topic, request.subscription, request.dispatch_config.max_unacked_messages
        )
        return pb.SubscriptionResponse(success=True)

    @unary
    async def GetSubscriptionDispatchConfig(
        self, request: pb.GetSubscriptionDispatchConfigRequest, context: Ctx
    ) -> pb.GetSubscriptionDispatchConfigResponse:
        window = await self.ops.get_dispatch_window(request.topic, request.subscription)
        out = pb.GetSubscriptionDispatchConfigResponse()
        if window is not None:
            out.dispatch_config.max_unacked_messages = window
        return out


class NamespaceAdminServicer(pb_grpc.NamespaceAdminServicer):  # type: ignore[misc]
    def __init__(self, ops: AdminOps) -> None:
        self.ops = ops

    @unary
    async def GetNamespaceTopics(self, request: pb.NamespaceRequest, context: Ctx) -> pb.TopicListResponse:
        # Danube's form: `ns/topic`, without the leading slash.
        topics = await self.ops.namespace_topics(request.name)
        return pb.TopicListResponse(topics=[t.lstrip("/") for t in topics])

    @unary
    async def GetNamespacePolicies(self, request: pb.NamespaceRequest, context: Ctx) -> pb.PolicyResponse:
        return pb.PolicyResponse(policies=policies_json(await self.ops.namespace_policies(request.name)))

    @unary
    async def CreateNamespace(self, request: pb.NamespaceRequest, context: Ctx) -> pb.NamespaceResponse:
        await self.ops.create_namespace(request.name)
        return pb.NamespaceResponse(success=True)

    @unary
    async def DeleteNamespace(self, request: pb.NamespaceRequest, context: Ctx) -> pb.NamespaceResponse:
        await self.ops.delete_namespace(request.name)
        return pb.NamespaceResponse(success=True)


_DRAIN = "broker drain and activation are not supported by Ister"
_BALANCE = "Ister assigns topics when they are created or orphaned and does not rebalance"


class BrokerAdminServicer(pb_grpc.BrokerAdminServicer):  # type: ignore[misc]
    def __init__(self, ops: AdminOps) -> None:
        self.ops = ops

    @unary
    async def ListBrokers(self, request: pb.Empty, context: Ctx) -> pb.BrokerListResponse:
        return pb.BrokerListResponse(
            brokers=[
                pb.BrokerInfo(
                    broker_id=str(b.broker_id),
                    broker_addr=b.broker_url,
                    broker_role=b.role,
                    admin_addr=b.admin_addr,
                    metrics_addr=b.metrics_addr,
                    broker_status=b.status,
                )
                for b in await self.ops.list_brokers()
            ]
        )

    @unary
    async def GetLeaderBroker(self, request: pb.Empty, context: Ctx) -> pb.BrokerResponse:
        leader = await self.ops.leader()
        return pb.BrokerResponse(leader=NO_LEADER if leader is None else str(leader))

    @unary
    async def ListNamespaces(self, request: pb.Empty, context: Ctx) -> pb.NamespaceListResponse:
        return pb.NamespaceListResponse(namespaces=await self.ops.list_namespaces())

    def _node(self) -> ClusterNode:
        node = self.ops.broker.cluster
        if node is None:
            raise FailedPrecondition("broker drain and rebalancing exist in cluster mode only")
        return node

    @staticmethod
    def _broker_id(text: str, node: ClusterNode) -> int:
        if not text.isdigit():
            raise InvalidArgument(f"broker id must be a decimal number, got {shown(text)}")
        broker = int(text)
        if node.cache.get(keys.broker_register(broker)) is None:
            raise NotFound(f"broker {broker} is not registered")
        return broker

    @unary
    async def UnloadBroker(self, request: pb.UnloadBrokerRequest, context: Ctx) -> pb.UnloadBrokerResponse:
        """Drain: the broker gets no new topics and the leader moves its topics away one at a time."""
        node = self._node()
        broker = self._broker_id(request.broker_id, node)
        state, _, _ = node.snapshot()
        owned = [t for t, b in state.assignments.items() if b == broker]
        if request.dry_run:
            return pb.UnloadBrokerResponse(started=False, total=len(owned), pending=len(owned))
        if not state.active() - {broker}:
            raise FailedPrecondition(f"cannot drain broker {broker}: no other active broker")
        await set_broker_mode(node, broker, DRAINING if owned else DRAINED, "admin_unload")
        return pb.UnloadBrokerResponse(started=True, total=len(owned), pending=len(owned))

    @unary
    async def ActivateBroker(
        self, request: pb.ActivateBrokerRequest, context: Ctx
    ) -> pb.ActivateBrokerResponse:
        node = self._node()
        broker = self._broker_id(request.broker_id, node)
        await set_broker_mode(node, broker, ACTIVE, request.reason or "admin_activate")
        return pb.ActivateBrokerResponse(success=True)

    @unary
    async def GetClusterBalance(
        self, request: pb.ClusterBalanceRequest, context: Ctx
    ) -> pb.ClusterBalanceResponse:
        node = self._node()
        balancer = node.balancer
        state, _, _ = node.snapshot()
        reports = balancer.reports()
        rankings = rank(balancer.strategy, reports)
        imb = imbalance(rankings, state.active())
        return pb.ClusterBalanceResponse(
            coefficient_of_variation=imb.cv,
            mean_load=imb.mean,
            max_load=imb.max_load,
            min_load=imb.min_load,
            std_deviation=imb.std_dev,
            broker_count=imb.broker_count,
            brokers=[
                pb.BrokerLoadInfo(
                    broker_id=b,
                    load=score,
                    topic_count=sum(1 for owner in state.assignments.values() if owner == b),
                    is_overloaded=b in imb.overloaded,
                    is_underloaded=b in imb.underloaded,
                )
                for b, score in rankings
            ],
            assignment_strategy=balancer.strategy,
        )

    @unary
    async def TriggerRebalance(self, request: pb.RebalanceRequest, context: Ctx) -> pb.RebalanceResponse:
        """Dry run: the moves rebalancing would make. Otherwise start one move now (pacing applies)."""
        node = self._node()
        now = time.time()
        max_moves = request.max_moves if request.HasField("max_moves") else None

        def proposed(moves: list[Move]) -> list[pb.ProposedMove]:
            return [
                pb.ProposedMove(
                    topic_name=m.topic,
                    from_broker=m.from_broker,
                    to_broker=m.to_broker,
                    estimated_load=m.estimated_load,
                    reason=m.reason,
                )
                for m in moves
            ]

        if request.dry_run:
            plan = node.balancer.dry_run(now, max_moves)
            return pb.RebalanceResponse(
                success=True, proposed_moves=proposed(plan.moves), error_message=plan.detail
            )
        leader = node.cache.get(keys.LEADER)
        if leader is None:
            raise Unavailable("no cluster leader right now; retry")
        decision = await node.balancer.check(leader, now, manual=True)
        moves = [decision.move] if decision.move is not None else []
        return pb.RebalanceResponse(
            success=True,
            moves_executed=len(moves),
            proposed_moves=proposed(moves),
            error_message=decision.detail,
        )


_RAFT = "Ister keeps cluster metadata in etcd (no Raft membership to manage)"


class ClusterAdminServicer(pb_grpc.ClusterAdminServicer):  # type: ignore[misc]
    ClusterStatus = _unimplemented("ClusterAdmin", "ClusterStatus", _RAFT)
    AddNode = _unimplemented("ClusterAdmin", "AddNode", _RAFT)
    PromoteNode = _unimplemented("ClusterAdmin", "PromoteNode", _RAFT)
    RemoveNode = _unimplemented("ClusterAdmin", "RemoveNode", _RAFT)


_SECURITY = "Ister has no authentication or authorization"


class SecurityAdminServicer(pb_grpc.SecurityAdminServicer):  # type: ignore[misc]
    CreateRole = _unimplemented("SecurityAdmin", "CreateRole", _SECURITY)
    GetRole = _unimplemented("SecurityAdmin", "GetRole", _SECURITY)
    ListRoles = _unimplemented("SecurityAdmin", "ListRoles", _SECURITY)
    DeleteRole = _unimplemented("SecurityAdmin", "DeleteRole", _SECURITY)
    CreateBinding = _unimplemented("SecurityAdmin", "CreateBinding", _SECURITY)
    GetBinding = _unimplemented("SecurityAdmin", "GetBinding", _SECURITY)
    ListBindings = _unimplemented("SecurityAdmin", "ListBindings", _SECURITY)
    ListAllBindings = _unimplemented("SecurityAdmin", "ListAllBindings", _SECURITY)
    DeleteBinding = _unimplemented("SecurityAdmin", "DeleteBinding", _SECURITY)


def add_admin_services(server: Any, broker: BrokerService) -> AdminOps:
    ops = AdminOps(broker)
    add_service(server, TopicAdminServicer(ops), pb, "TopicAdmin")
    add_service(server, NamespaceAdminServicer(ops), pb, "NamespaceAdmin")
    add_service(server, BrokerAdminServicer(ops), pb, "BrokerAdmin")
    add_service(server, ClusterAdminServicer(), pb, "ClusterAdmin")
    add_service(server, SecurityAdminServicer(), pb, "SecurityAdmin")
    add_schema_service(server, broker)  # Danube serves the registry on both ports
    return ops


async def start_admin_server(broker: BrokerService, addr: str) -> Any:
    """Serve the admin API on `addr` (HOST:PORT); OSError when the address cannot be bound.

    The caller stops it (`await server.stop(grace)`) before closing the broker.
    """
    host, port = split_host_port(addr, "admin_addr")
    server = grpc.aio.server(options=ADMIN_SERVER_OPTIONS)
    add_admin_services(server, broker)
    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError:  # grpc raises RuntimeError when the address is taken
        bound = 0
    if bound == 0:
        raise OSError(f"cannot listen on admin_addr {addr} (address in use or not local)")
    await server.start()
    return server
