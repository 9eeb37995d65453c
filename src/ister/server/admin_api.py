"""Servicers of the Danube admin contract (package `danube_admin`) and the admin gRPC server (port 50051).

The servicers only convert between protobuf and the admin operations (`AdminOps` and the broker's
`Ownership` for drain and rebalancing); errors map to gRPC statuses through the same decorator as the client
API. RPCs Ister does not implement (Raft membership) answer UNIMPLEMENTED with a message saying so.
Behaviour and status codes: docs/admin.md.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc

from ister.broker.admin_ops import NO_LEADER, AdminOps, SubscriptionPolicy, TopicInfo, policies_json
from ister.broker.service import BrokerService
from ister.config import TlsFiles
from ister.core.dispatch import FailurePolicy
from ister.core.dispatch.policy import BackoffStrategy, PoisonPolicy
from ister.errors import InvalidArgument
from ister.security.api_keys import ApiKeyStore
from ister.security.rbac_store import RbacStore
from ister.server.errors import unary
from ister.server.handlers import add_service
from ister.server.schema_api import add_schema_service
from ister.server.security_api import ApiKeyExchangeServicer, IsterAdminServicer, SecurityAdminServicer
from ister.server.tls import bind
from ister.wire.admin_convert import replication_from_wire
from ister.wire.enums import reliable_from_wire
from ister.wire.gen import DanubeAdmin_pb2 as pb
from ister.wire.gen import DanubeAdmin_pb2_grpc as pb_grpc
from ister.wire.gen import ister_v1_pb2 as ister_pb

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
        await self.ops.create_topic(
            request.name,
            reliable=reliable_from_wire(request.dispatch_strategy, "dispatch_strategy"),
            schema_subject=request.schema_subject if request.HasField("schema_subject") else None,
            replication=replication_from_wire(request),
        )
        return pb.TopicResponse(success=True)

    @unary
    async def CreatePartitionedTopic(
        self, request: pb.PartitionedTopicRequest, context: Ctx
    ) -> pb.TopicResponse:
        await self.ops.create_topic(
            request.base_name,
            reliable=reliable_from_wire(request.dispatch_strategy, "dispatch_strategy"),
            partitions=request.partitions,
            schema_subject=request.schema_subject if request.HasField("schema_subject") else None,
            replication=replication_from_wire(request),
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
        if d.schema is not None:
            out.schema_id = d.schema.schema_id
            out.schema_version = d.schema.version
            out.schema_type = d.schema.schema.type.value
            out.compatibility_mode = d.schema.compatibility_mode.value
        if d.replication is not None:
            out.replicas.extend(d.replication.replicas)
            out.in_sync_replicas.extend(d.replication.isr)
            out.min_insync_replicas = d.replication.min_insync
            out.leader_epoch = d.replication.epoch
        if d.replication_state is not None:
            out.replication_state = d.replication_state
        for follower, lag in (d.replica_lag or {}).items():
            out.replica_lag[follower] = lag
        out.attached_consumers.extend(
            pb.AttachedConsumer(subscription=s, consumer_name=c) for s, c in d.attached
        )
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
        c = request.dispatch_config
        extra = c.HasField("rebalance_delay_seconds") or c.HasField("max_handoff_seconds")
        await self.ops.set_dispatch_config(
            request.topic,
            request.subscription,
            # 0 leaves the window as it is when a partition setting is given (proto3 has no "unset" here)
            None if extra and c.max_unacked_messages == 0 else c.max_unacked_messages,
            c.rebalance_delay_seconds if c.HasField("rebalance_delay_seconds") else None,
            c.max_handoff_seconds if c.HasField("max_handoff_seconds") else None,
        )
        return pb.SubscriptionResponse(success=True)

    @unary
    async def GetSubscriptionDispatchConfig(
        self, request: pb.GetSubscriptionDispatchConfigRequest, context: Ctx
    ) -> pb.GetSubscriptionDispatchConfigResponse:
        config = await self.ops.get_dispatch_config(request.topic, request.subscription)
        out = pb.GetSubscriptionDispatchConfigResponse()
        if config is not None:
            out.dispatch_config.max_unacked_messages = config.max_unacked_messages or 0
            if config.rebalance_delay_seconds is not None:
                out.dispatch_config.rebalance_delay_seconds = config.rebalance_delay_seconds
            if config.max_handoff_seconds is not None:
                out.dispatch_config.max_handoff_seconds = config.max_handoff_seconds
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

    @unary
    async def UnloadBroker(self, request: pb.UnloadBrokerRequest, context: Ctx) -> pb.UnloadBrokerResponse:
        """Drain: the broker gets no new topics and the leader moves its topics away one at a time."""
        plan = await self.ops.placement_admin.drain(request.broker_id, request.dry_run)
        return pb.UnloadBrokerResponse(started=plan.started, total=plan.total, pending=plan.pending)

    @unary
    async def ActivateBroker(
        self, request: pb.ActivateBrokerRequest, context: Ctx
    ) -> pb.ActivateBrokerResponse:
        await self.ops.placement_admin.activate(request.broker_id, request.reason)
        return pb.ActivateBrokerResponse(success=True)

    @unary
    async def GetClusterBalance(
        self, request: pb.ClusterBalanceRequest, context: Ctx
    ) -> pb.ClusterBalanceResponse:
        b = await self.ops.placement_admin.balance()
        return pb.ClusterBalanceResponse(
            coefficient_of_variation=b.coefficient_of_variation,
            mean_load=b.mean_load,
            max_load=b.max_load,
            min_load=b.min_load,
            std_deviation=b.std_deviation,
            broker_count=b.broker_count,
            brokers=[
                pb.BrokerLoadInfo(
                    broker_id=x.broker_id,
                    load=x.load,
                    topic_count=x.topic_count,
                    is_overloaded=x.overloaded,
                    is_underloaded=x.underloaded,
                )
                for x in b.brokers
            ],
            assignment_strategy=b.strategy,
        )

    @unary
    async def TriggerRebalance(self, request: pb.RebalanceRequest, context: Ctx) -> pb.RebalanceResponse:
        """Dry run: the moves rebalancing would make. Otherwise start one move now (pacing applies)."""
        max_moves = request.max_moves if request.HasField("max_moves") else None
        result = await self.ops.placement_admin.rebalance(request.dry_run, max_moves)
        return pb.RebalanceResponse(
            success=True,
            moves_executed=result.executed,
            proposed_moves=[
                pb.ProposedMove(
                    topic_name=m.topic,
                    from_broker=m.from_broker,
                    to_broker=m.to_broker,
                    estimated_load=m.estimated_load,
                    reason=m.reason,
                )
                for m in result.moves
            ],
            error_message=result.detail,
        )


_RAFT = "Ister keeps cluster metadata in etcd (no Raft membership to manage)"


class ClusterAdminServicer(pb_grpc.ClusterAdminServicer):  # type: ignore[misc]
    ClusterStatus = _unimplemented("ClusterAdmin", "ClusterStatus", _RAFT)
    AddNode = _unimplemented("ClusterAdmin", "AddNode", _RAFT)
    PromoteNode = _unimplemented("ClusterAdmin", "PromoteNode", _RAFT)
    RemoveNode = _unimplemented("ClusterAdmin", "RemoveNode", _RAFT)


def add_admin_services(
    server: Any,
    broker: BrokerService,
    rbac: RbacStore | None = None,
    api_keys: ApiKeyStore | None = None,
) -> AdminOps:
    ops = AdminOps(broker)
    add_service(server, TopicAdminServicer(ops), pb, "TopicAdmin")
    add_service(server, NamespaceAdminServicer(ops), pb, "NamespaceAdmin")
    add_service(server, BrokerAdminServicer(ops), pb, "BrokerAdmin")
    add_service(server, ClusterAdminServicer(), pb, "ClusterAdmin")
    rbac = rbac if rbac is not None else RbacStore(broker.store, [])
    add_service(server, SecurityAdminServicer(rbac), pb, "SecurityAdmin")
    if api_keys is not None:
        groups = broker.consumer_refs.partition_groups
        add_service(server, IsterAdminServicer(api_keys, groups, ops), ister_pb, "IsterAdmin")
        add_service(server, ApiKeyExchangeServicer(api_keys), ister_pb, "Ister", only={"ExchangeApiKey"})
    add_schema_service(server, broker)  # Danube serves the registry on both ports
    return ops


async def start_admin_server(
    broker: BrokerService,
    addr: str,
    rbac: RbacStore | None = None,
    *,
    tls: TlsFiles | None = None,
    interceptors: Sequence[Any] = (),
    api_keys: ApiKeyStore | None = None,
) -> Any:
    """Serve the admin API on `addr` (HOST:PORT), over TLS when `tls` names files; OSError when the
    address cannot be bound.

    The caller stops it (`await server.stop(grace)`) before closing the broker.
    """
    server = grpc.aio.server(options=ADMIN_SERVER_OPTIONS, interceptors=list(interceptors) or None)
    add_admin_services(server, broker, rbac, api_keys)
    bound = bind(server, addr, tls, "admin_addr")
    if bound == 0:
        raise OSError(f"cannot listen on admin_addr {addr} (address in use or not local)")
    await server.start()
    return server
