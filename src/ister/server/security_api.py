"""`danube_admin.SecurityAdmin`: roles and bindings (Danube's RPCs and status codes, docs/security.md), and
Ister's `ister.v1.IsterAdmin`: API keys (Danube's admin proto has none), partition assignments, namespace
replication and the brokers' load reports."""

from __future__ import annotations

import time
from typing import Any

from ister.broker.admin_ops import AdminOps
from ister.broker.partition_groups import PartitionGroups
from ister.broker.retention_admin import BacklogSettings, RetentionInEffect
from ister.broker.table_admin import TableInEffect
from ister.core.replication_policy import ReplicationSetting
from ister.errors import FailedPrecondition, InvalidArgument
from ister.ids import TopicName
from ister.security.api_keys import ApiKey, ApiKeyStore
from ister.security.rbac import Binding, Role
from ister.security.rbac_store import RbacStore
from ister.server.cursor_admin import CursorAdmin
from ister.server.errors import unary
from ister.server.health_api import health_pb, topic_page_pb
from ister.server.recovery_api import RecoveryService
from ister.server.stats_api import StatsService
from ister.tables.policy import checked
from ister.wire.admin_convert import replication_from_wire
from ister.wire.gen import DanubeAdmin_pb2 as pb
from ister.wire.gen import DanubeAdmin_pb2_grpc as pb_grpc
from ister.wire.gen import ister_v1_pb2 as ipb
from ister.wire.gen import ister_v1_pb2_grpc as ipb_grpc

Ctx = Any


def _role_pb(r: Role) -> pb.RoleDefinition:
    return pb.RoleDefinition(name=r.name, permissions=list(r.permissions), system=r.system)


def _binding_pb(b: Binding) -> pb.BindingDefinition:
    return pb.BindingDefinition(
        id=b.id,
        principal_type=b.principal_type,
        principal_name=b.principal_name,
        role_names=list(b.role_names),
        scope=b.scope,
        resource_name=b.resource_name,
    )


class SecurityAdminServicer(pb_grpc.SecurityAdminServicer):  # type: ignore[misc]
    def __init__(self, rbac: RbacStore) -> None:
        self.rbac = rbac

    @unary
    async def CreateRole(self, request: pb.CreateRoleRequest, context: Ctx) -> pb.CreateRoleResponse:
        r = request.role
        await self.rbac.create_role(Role(r.name, tuple(r.permissions), r.system))
        return pb.CreateRoleResponse(success=True)

    @unary
    async def GetRole(self, request: pb.GetRoleRequest, context: Ctx) -> pb.GetRoleResponse:
        return pb.GetRoleResponse(role=_role_pb(self.rbac.get_role(request.name)))

    @unary
    async def ListRoles(self, request: Any, context: Ctx) -> pb.ListRolesResponse:
        return pb.ListRolesResponse(roles=[_role_pb(r) for r in self.rbac.list_roles()])

    @unary
    async def DeleteRole(self, request: pb.DeleteRoleRequest, context: Ctx) -> pb.DeleteRoleResponse:
        await self.rbac.delete_role(request.name)
        return pb.DeleteRoleResponse(success=True)

    @unary
    async def CreateBinding(self, request: pb.CreateBindingRequest, context: Ctx) -> pb.CreateBindingResponse:
        b = request.binding
        await self.rbac.create_binding(
            Binding(
                id=b.id,
                principal_type=b.principal_type,
                principal_name=b.principal_name,
                role_names=tuple(b.role_names),
                scope=b.scope,
                resource_name=b.resource_name,
            )
        )
        return pb.CreateBindingResponse(success=True)

    @unary
    async def GetBinding(self, request: pb.GetBindingRequest, context: Ctx) -> pb.GetBindingResponse:
        b = self.rbac.get_binding(request.scope, request.resource_name, request.binding_id)
        return pb.GetBindingResponse(binding=_binding_pb(b))

    @unary
    async def ListBindings(self, request: pb.ListBindingsRequest, context: Ctx) -> pb.ListBindingsResponse:
        found = self.rbac.list_bindings(
            request.scope or None, request.resource_name if request.scope else None
        )
        return pb.ListBindingsResponse(bindings=[_binding_pb(b) for b in found])

    @unary
    async def ListAllBindings(self, request: Any, context: Ctx) -> pb.ListBindingsResponse:
        return pb.ListBindingsResponse(bindings=[_binding_pb(b) for b in self.rbac.list_bindings()])

    @unary
    async def DeleteBinding(self, request: pb.DeleteBindingRequest, context: Ctx) -> pb.DeleteBindingResponse:
        await self.rbac.delete_binding(request.scope, request.resource_name, request.binding_id)
        return pb.DeleteBindingResponse(success=True)


def _key_pb(k: ApiKey) -> ipb.ApiKeyInfo:
    return ipb.ApiKeyInfo(
        id=k.id,
        principal_type=k.principal_type,
        principal_name=k.principal_name,
        description=k.description,
        created_at_ms=k.created_at_ms,
    )


async def exchange_api_key(
    api_keys: ApiKeyStore | None, request: ipb.ExchangeApiKeyRequest
) -> ipb.ExchangeApiKeyResponse:
    """`Ister.ExchangeApiKey`, on the client port and (for `ister admin --api-key`) the admin port."""
    if api_keys is None:
        raise FailedPrecondition("this broker does not exchange API keys")
    token, exp, key = await api_keys.exchange(request.api_key, request.ttl_seconds)
    return ipb.ExchangeApiKeyResponse(
        token=token, expires_at_ms=int(exp * 1000), principal=str(key.principal)
    )


class ApiKeyExchangeServicer:
    """The one method of `ister.v1.Ister` the admin port serves: the admin CLI knows only that port."""

    def __init__(self, api_keys: ApiKeyStore) -> None:
        self.api_keys = api_keys

    @unary
    async def ExchangeApiKey(
        self, request: ipb.ExchangeApiKeyRequest, context: Ctx
    ) -> ipb.ExchangeApiKeyResponse:
        return await exchange_api_key(self.api_keys, request)


class IsterAdminServicer(ipb_grpc.IsterAdminServicer):  # type: ignore[misc]
    def __init__(
        self, api_keys: ApiKeyStore, groups: PartitionGroups | None = None, ops: AdminOps | None = None
    ) -> None:
        self.api_keys = api_keys
        self.groups = groups
        self.ops = ops
        self.cursors = CursorAdmin(ops) if ops is not None else None
        self.stats = StatsService(ops) if ops is not None else None
        self.recovery = RecoveryService(ops) if ops is not None else None

    @unary
    async def GetClusterHealth(
        self, request: ipb.ClusterHealthRequest, context: Ctx
    ) -> ipb.ClusterHealthResponse:
        if self.ops is None:
            raise FailedPrecondition("this server does not administer brokers")
        return health_pb(await self.ops.placement_admin.cluster_health(request.max_moves))

    @unary
    async def ListTopics(self, request: ipb.ListTopicsRequest, context: Ctx) -> ipb.ListTopicsResponse:
        if self.ops is None:
            raise FailedPrecondition("this server does not administer topics")
        r = request
        page = await self.ops.list_topics(
            r.namespace.strip("/"), r.name_filter, r.sort, r.descending, r.offset, r.limit
        )
        return topic_page_pb(page)

    # -- unclean recovery (issue 39) ----------------------------------------------------------------------
    @unary
    async def RecoverTopic(self, request: ipb.RecoverTopicRequest, context: Ctx) -> ipb.RecoverTopicResponse:
        if self.recovery is None:
            raise FailedPrecondition("this server does not administer topics")
        return await self.recovery.recover(request, context)

    @unary
    async def DescribeLocalCopy(self, request: ipb.LocalCopyRequest, context: Ctx) -> ipb.LocalCopyResponse:
        if self.recovery is None:
            raise FailedPrecondition("this server does not administer topics")
        return await self.recovery.local_copy(request)

    # -- cursors and peeking (issue 37) -------------------------------------------------------------------
    @unary
    async def ResetCursor(self, request: ipb.ResetCursorRequest, context: Ctx) -> ipb.ResetCursorResponse:
        if self.cursors is None:
            raise FailedPrecondition("this server does not administer topics")
        return await self.cursors.reset(request, context)

    @unary
    async def PeekMessages(self, request: ipb.PeekMessagesRequest, context: Ctx) -> ipb.PeekMessagesResponse:
        if self.cursors is None:
            raise FailedPrecondition("this server does not administer topics")
        return await self.cursors.peek(request, context)

    @unary
    async def GetTopicStats(self, request: ipb.TopicStatsRequest, context: Ctx) -> ipb.TopicStatsResponse:
        if self.stats is None:
            raise FailedPrecondition("this server does not administer topics")
        return await self.stats.topic_stats(request, context)

    @unary
    async def ListSubscriptionStats(
        self, request: ipb.ListSubscriptionStatsRequest, context: Ctx
    ) -> ipb.ListSubscriptionStatsResponse:
        if self.stats is None:
            raise FailedPrecondition("this server does not administer topics")
        return await self.stats.list_subscriptions(request, context)

    @unary
    async def SetNamespaceReplication(
        self, request: ipb.SetNamespaceReplicationRequest, context: Ctx
    ) -> ipb.SetNamespaceReplicationResponse:
        if self.ops is None:
            raise FailedPrecondition("this server does not administer namespaces")
        setting = replication_from_wire(request) or ReplicationSetting()
        policy = await self.ops.set_namespace_replication(request.namespace, setting)
        out = ipb.SetNamespaceReplicationResponse()
        if policy.replication_factor:
            out.replication_factor = policy.replication_factor
        if policy.min_insync_replicas:
            out.min_insync_replicas = policy.min_insync_replicas
        return out

    @unary
    async def SetRetention(self, request: ipb.SetRetentionRequest, context: Ctx) -> ipb.RetentionResponse:
        if self.ops is None:
            raise FailedPrecondition("this server does not administer retention")
        time_ms = request.time_ms if request.HasField("time_ms") else None
        size = request.size_bytes if request.HasField("size_bytes") else None
        backlog = BacklogSettings(
            request.backlog_quota_size_bytes if request.HasField("backlog_quota_size_bytes") else None,
            request.backlog_quota_time_ms if request.HasField("backlog_quota_time_ms") else None,
            request.backlog_quota_policy or None,
            request.message_ttl_ms if request.HasField("message_ttl_ms") else None,
        )
        if request.topic:
            if not backlog.empty:
                raise InvalidArgument(
                    "backlog quotas and message TTL are namespace policies; give the namespace"
                )
            found = await self.ops.retention.set_topic(request.topic, time_ms, size, request.clear)
        else:
            if request.clear:
                raise InvalidArgument("clear applies to a topic's own limits; give the topic")
            found = await self.ops.retention.set_namespace(request.namespace, time_ms, size, backlog)
        return _retention(found)

    @unary
    async def GetRetention(self, request: ipb.GetRetentionRequest, context: Ctx) -> ipb.RetentionResponse:
        if self.ops is None:
            raise FailedPrecondition("this server does not administer retention")
        if request.topic:
            return _retention(await self.ops.retention.get_topic(request.topic))
        return _retention(await self.ops.retention.get_namespace(request.namespace))

    @unary
    async def SetTablePolicy(
        self, request: ipb.SetTablePolicyRequest, context: Ctx
    ) -> ipb.TablePolicyResponse:
        if self.ops is None:
            raise FailedPrecondition("this server does not administer tables")
        setting = checked(
            request.format or None,
            request.partition or None,
            request.interval_ms if request.HasField("interval_ms") else None,
        )
        if request.topic:
            found = await self.ops.tables.set_topic(request.topic, setting, request.clear)
        else:
            if request.clear:
                raise InvalidArgument("clear applies to a topic's own table policy; give the topic")
            found = await self.ops.tables.set_namespace(request.namespace, setting)
        return _table(found)

    @unary
    async def GetTablePolicy(
        self, request: ipb.GetTablePolicyRequest, context: Ctx
    ) -> ipb.TablePolicyResponse:
        if self.ops is None:
            raise FailedPrecondition("this server does not administer tables")
        if request.topic:
            return _table(await self.ops.tables.get_topic(request.topic))
        return _table(await self.ops.tables.get_namespace(request.namespace))

    @unary
    async def SetLimits(self, request: ipb.SetLimitsRequest, context: Ctx) -> ipb.LimitsResponse:
        if self.ops is None:
            raise FailedPrecondition("this server does not administer limits")
        given = dict(request.limits)
        if request.topic:
            found = await self.ops.limits.set_topic(request.topic, given, request.clear)
        else:
            if request.clear:
                raise InvalidArgument("clear applies to a topic's own rates; give the topic")
            found = await self.ops.limits.set_namespace(request.namespace, given)
        return ipb.LimitsResponse(limits=found.limits, sources=found.sources)

    @unary
    async def GetLimits(self, request: ipb.GetLimitsRequest, context: Ctx) -> ipb.LimitsResponse:
        if self.ops is None:
            raise FailedPrecondition("this server does not administer limits")
        if request.topic:
            found = await self.ops.limits.get_topic(request.topic)
        else:
            found = await self.ops.limits.get_namespace(request.namespace)
        return ipb.LimitsResponse(limits=found.limits, sources=found.sources)

    @unary
    async def SetCompression(
        self, request: ipb.SetCompressionRequest, context: Ctx
    ) -> ipb.CompressionResponse:
        if self.ops is None:
            raise FailedPrecondition("this server does not administer compression")
        admin = self.ops.compression
        if request.topic:
            found = await admin.set_topic(
                request.topic, request.compression, request.clear, request.dictionary
            )
        else:
            found = await admin.set_namespace(
                request.namespace, request.compression, request.dictionary, request.clear
            )
        return ipb.CompressionResponse(**found._asdict())

    @unary
    async def GetCompression(
        self, request: ipb.GetCompressionRequest, context: Ctx
    ) -> ipb.CompressionResponse:
        if self.ops is None:
            raise FailedPrecondition("this server does not administer compression")
        admin = self.ops.compression
        if request.topic:
            found = await admin.get_topic(request.topic)
        else:
            found = await admin.get_namespace(request.namespace)
        return ipb.CompressionResponse(**found._asdict())

    @unary
    async def ListBrokerLoads(
        self, request: ipb.ListBrokerLoadsRequest, context: Ctx
    ) -> ipb.ListBrokerLoadsResponse:
        if self.ops is None:
            raise FailedPrecondition("this server does not administer brokers")
        return ipb.ListBrokerLoadsResponse(
            brokers=[
                ipb.BrokerLoadReport(
                    broker_id=r.broker_id,
                    timestamp=r.timestamp,
                    cpu_percent=r.cpu,
                    memory_percent=r.memory,
                    topics=r.topic_count,
                    message_rate=r.total_message_rate,
                    throughput_mbps=r.total_throughput_mbps,
                    followed_topics=r.followed_topics,
                    follower_message_rate=r.follower_message_rate,
                    follower_throughput_mbps=r.follower_throughput_mbps,
                )
                for r in await self.ops.placement_admin.load_reports()
            ]
        )

    @unary
    async def ListPartitionAssignments(
        self, request: ipb.ListPartitionAssignmentsRequest, context: Ctx
    ) -> ipb.ListPartitionAssignmentsResponse:
        name = TopicName.parse(request.topic)
        rows = self.groups.assignments(name.full, time.monotonic()) if self.groups is not None else []
        return ipb.ListPartitionAssignmentsResponse(
            assignments=[
                ipb.PartitionAssignment(
                    subscription=sub,
                    partition=p,
                    consumer=consumer or "",
                    handing_off_to=target or "",
                    paused_seconds=paused,
                )
                for sub, p, consumer, target, paused in rows
            ]
        )

    @unary
    async def CreateApiKey(self, request: ipb.CreateApiKeyRequest, context: Ctx) -> ipb.CreateApiKeyResponse:
        key, text = await self.api_keys.create(
            request.principal_name, request.principal_type, request.description
        )
        return ipb.CreateApiKeyResponse(key=_key_pb(key), api_key=text)

    @unary
    async def ListApiKeys(self, request: ipb.ListApiKeysRequest, context: Ctx) -> ipb.ListApiKeysResponse:
        return ipb.ListApiKeysResponse(keys=[_key_pb(k) for k in await self.api_keys.list()])

    @unary
    async def CreateToken(self, request: ipb.CreateTokenRequest, context: Ctx) -> ipb.CreateTokenResponse:
        kind = request.principal_type or "service_account"
        token, exp = self.api_keys.create_token(request.principal_name, kind, request.ttl_seconds)
        return ipb.CreateTokenResponse(
            token=token, expires_at_ms=exp * 1000, principal=f"{kind}:{request.principal_name}"
        )

    @unary
    async def RevokeApiKey(self, request: ipb.RevokeApiKeyRequest, context: Ctx) -> ipb.RevokeApiKeyResponse:
        await self.api_keys.revoke(request.id)
        return ipb.RevokeApiKeyResponse()


def _table(found: TableInEffect) -> ipb.TablePolicyResponse:
    p = found.policy
    return ipb.TablePolicyResponse(
        format=p.format,
        partition=p.partition,
        interval_ms=p.interval_ms,
        format_source=p.format_source,
        partition_source=p.partition_source,
        interval_source=p.interval_source,
        catalog_uri=found.catalog_uri,
        tables=found.tables,
        properties=found.properties,
    )


def _retention(found: RetentionInEffect) -> ipb.RetentionResponse:
    return ipb.RetentionResponse(
        time_ms=found.time_ms,
        size_bytes=found.size_bytes,
        time_source=found.time_source,
        size_source=found.size_source,
        start_offset=found.start_offset,
        backlog_quota_size_bytes=found.quota_size_bytes,
        backlog_quota_time_ms=found.quota_time_ms,
        backlog_quota_policy=found.quota_policy,
        message_ttl_ms=found.message_ttl_ms,
    )
