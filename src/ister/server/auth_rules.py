"""Which permission on which resource every RPC of every service needs (docs/security.md has the table).

`None` as permission: authentication only. `change`: a successful call is an admin change (audited).
`kind` names the checks beyond the table: `subscribe` records the consumer's owner, `receive` and `ack`
accept only the owner of the consumer (a consumer acks only its own deliveries), `stream` applies the rule
to the first frame of a client stream (Ister's Publish and Consume), `peer` admits only another broker of
the cluster (security/peer.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ister.security.rbac import CLUSTER, Resource, topic_resource

Extract = Callable[[Any], Resource]


@dataclass(frozen=True, slots=True)
class Rule:
    permission: str | None
    resource: Extract
    change: bool = False
    kind: str = ""  # "", subscribe, receive, ack, stream, public (no credentials needed)
    # What a successful change's audit line names as its resource, when `resource` says too little.
    audited: Callable[[Any], str] | None = None


def _cluster(_: Any) -> Resource:
    return CLUSTER


def _field(name: str) -> Extract:
    def extract(request: Any) -> Resource:
        return topic_resource(getattr(request, name))

    return extract


def _namespace(request: Any) -> Resource:
    return Resource("namespace", request.name.strip("/"))


def _field_namespace(request: Any) -> Resource:
    return Resource("namespace", request.namespace.strip("/"))


def _topic_or_namespace(request: Any) -> Resource:
    """A topic's own setting when the request names a topic, else its namespace's policy."""
    return topic_resource(request.topic) if request.topic else _field_namespace(request)


def _namespace_or_cluster(request: Any) -> Resource:
    return _field_namespace(request) if request.namespace.strip("/") else CLUSTER


def _msg_topic(request: Any) -> Resource:
    return topic_resource(request.msg_id.topic_name) if request.HasField("msg_id") else CLUSTER


def _open_topic(request: Any) -> Resource:
    return topic_resource(request.open.topic) if request.WhichOneof("kind") == "open" else CLUSTER


def _token_audit(request: Any) -> str:
    """The token's principal and lifetime (never the token)."""
    kind = request.principal_type or "service_account"
    return f"token:{kind}:{request.principal_name}:{request.ttl_seconds}s"


T_NAME, T_TOPIC, T_TOPIC_NAME = _field("name"), _field("topic"), _field("topic_name")
_D, _S, _A, _I = "danube.", "danube_schema.SchemaRegistry/", "danube_admin.", "ister.v1.Ister/"

RULES: dict[str, Rule] = {
    # the client contract
    f"/{_D}ProducerService/CreateProducer": Rule("Produce", T_TOPIC_NAME),
    f"/{_D}ProducerService/SendMessage": Rule("Produce", _msg_topic),
    f"/{_D}ConsumerService/Subscribe": Rule("Consume", T_TOPIC_NAME, kind="subscribe"),
    f"/{_D}ConsumerService/ReceiveMessages": Rule(None, _cluster, kind="receive"),
    f"/{_D}ConsumerService/Ack": Rule("Consume", _msg_topic, kind="ack"),
    f"/{_D}ConsumerService/Nack": Rule("Consume", _msg_topic, kind="ack"),
    f"/{_D}Discovery/TopicLookup": Rule("Lookup", T_TOPIC),
    f"/{_D}Discovery/TopicPartitions": Rule("Lookup", T_TOPIC),
    f"/{_D}HealthCheck/HealthCheck": Rule(None, _cluster),
    # the Ister batch API
    f"/{_I}Lookup": Rule("Lookup", T_TOPIC),
    f"/{_I}Publish": Rule("Produce", _open_topic, kind="stream"),
    f"/{_I}Consume": Rule("Consume", _open_topic, kind="stream"),
    f"/{_I}Offsets": Rule("Lookup", T_TOPIC),
    f"/{_I}Read": Rule("Consume", T_TOPIC),
    f"/{_I}SetCursor": Rule("Consume", T_TOPIC, change=True),
    # a zstd dictionary of the topic's namespace, for its producers and consumers (both look it up)
    f"/{_I}GetCompressionDictionary": Rule("Lookup", T_TOPIC),
    # the schema registry (both ports)
    f"/{_S}RegisterSchema": Rule("ManageSchema", _cluster, change=True),
    f"/{_S}GetSchema": Rule("ReadSchema", _cluster),
    f"/{_S}GetLatestSchema": Rule("ReadSchema", _cluster),
    f"/{_S}ListVersions": Rule("ReadSchema", _cluster),
    f"/{_S}CheckCompatibility": Rule("ReadSchema", _cluster),
    f"/{_S}DeleteSchemaVersion": Rule("ManageSchema", _cluster, change=True),
    f"/{_S}SetCompatibilityMode": Rule("ManageSchema", _cluster, change=True),
    f"/{_S}ConfigureTopicSchema": Rule("ManageSchema", T_TOPIC_NAME, change=True),
    f"/{_S}UpdateTopicValidationPolicy": Rule("ManageSchema", T_TOPIC_NAME, change=True),
    f"/{_S}GetTopicSchemaConfig": Rule("ReadSchema", T_TOPIC_NAME),
    f"/{_S}ListSubjects": Rule("ReadSchema", _cluster),
    # admin
    f"/{_A}BrokerAdmin/ListBrokers": Rule("ManageBroker", _cluster),
    f"/{_A}BrokerAdmin/GetLeaderBroker": Rule("ManageBroker", _cluster),
    f"/{_A}BrokerAdmin/ListNamespaces": Rule("ManageNamespace", _cluster),
    f"/{_A}BrokerAdmin/UnloadBroker": Rule("ManageBroker", _cluster, change=True),
    f"/{_A}BrokerAdmin/ActivateBroker": Rule("ManageBroker", _cluster, change=True),
    f"/{_A}BrokerAdmin/GetClusterBalance": Rule("ManageCluster", _cluster),
    f"/{_A}BrokerAdmin/TriggerRebalance": Rule("ManageCluster", _cluster, change=True),
    f"/{_A}ClusterAdmin/ClusterStatus": Rule("ManageCluster", _cluster),
    f"/{_A}ClusterAdmin/AddNode": Rule("ManageCluster", _cluster, change=True),
    f"/{_A}ClusterAdmin/PromoteNode": Rule("ManageCluster", _cluster, change=True),
    f"/{_A}ClusterAdmin/RemoveNode": Rule("ManageCluster", _cluster, change=True),
    f"/{_A}NamespaceAdmin/GetNamespaceTopics": Rule("ManageNamespace", _namespace),
    f"/{_A}NamespaceAdmin/GetNamespacePolicies": Rule("ManageNamespace", _namespace),
    f"/{_A}NamespaceAdmin/CreateNamespace": Rule("ManageNamespace", _namespace, change=True),
    f"/{_A}NamespaceAdmin/DeleteNamespace": Rule("ManageNamespace", _namespace, change=True),
    f"/{_A}TopicAdmin/ListNamespaceTopics": Rule("ManageTopic", _namespace),
    f"/{_A}TopicAdmin/ListBrokerTopics": Rule("ManageTopic", _cluster),
    f"/{_A}TopicAdmin/CreateTopic": Rule("ManageTopic", T_NAME, change=True),
    f"/{_A}TopicAdmin/CreatePartitionedTopic": Rule("ManageTopic", _field("base_name"), change=True),
    f"/{_A}TopicAdmin/DeleteTopic": Rule("ManageTopic", T_NAME, change=True),
    f"/{_A}TopicAdmin/UnloadTopic": Rule("ManageTopic", T_NAME, change=True),
    f"/{_A}TopicAdmin/ListSubscriptions": Rule("ManageTopic", T_NAME),
    f"/{_A}TopicAdmin/Unsubscribe": Rule("ManageTopic", T_TOPIC, change=True),
    f"/{_A}TopicAdmin/SetSubscriptionFailurePolicy": Rule("ManageTopic", T_TOPIC, change=True),
    f"/{_A}TopicAdmin/GetSubscriptionFailurePolicy": Rule("ManageTopic", T_TOPIC),
    f"/{_A}TopicAdmin/DescribeTopic": Rule("ManageTopic", T_NAME),
    f"/{_A}TopicAdmin/SetSubscriptionDispatchConfig": Rule("ManageTopic", T_TOPIC, change=True),
    f"/{_A}TopicAdmin/GetSubscriptionDispatchConfig": Rule("ManageTopic", T_TOPIC),
}
# The one call without credentials: it is how a client holding an API key gets them (a wrong key is
# UNAUTHENTICATED from the call itself, and audited).
RULES[f"/{_I}ExchangeApiKey"] = Rule(None, _cluster, kind="public")
# Between brokers: a follower replica fetching a topic's records is a cluster-level right.
RULES["/ister.v1.IsterReplica/Replicate"] = Rule(None, _cluster, kind="peer")
_IA = "ister.v1.IsterAdmin/"
RULES[f"/{_IA}CreateApiKey"] = Rule("ManageCluster", _cluster, change=True)
RULES[f"/{_IA}RevokeApiKey"] = Rule("ManageCluster", _cluster, change=True)
RULES[f"/{_IA}ListApiKeys"] = Rule("ManageCluster", _cluster)
RULES[f"/{_IA}CreateToken"] = Rule("ManageCluster", _cluster, change=True, audited=_token_audit)
RULES[f"/{_IA}ListPartitionAssignments"] = Rule("ManageTopic", T_TOPIC)
RULES[f"/{_IA}ListBrokerLoads"] = Rule("ManageCluster", _cluster)  # as GetClusterBalance
RULES[f"/{_IA}GetClusterHealth"] = Rule("ManageCluster", _cluster)  # moves, failures, replication
# the namespace's policy record, as CreateNamespace writes it
RULES[f"/{_IA}SetNamespaceReplication"] = Rule("ManageNamespace", _field_namespace, change=True)
# retention: a topic's own limits are the topic's to manage, a namespace's its policy's
RULES[f"/{_IA}SetRetention"] = Rule("ManageNamespace", _topic_or_namespace, change=True)
RULES[f"/{_IA}GetRetention"] = Rule("ManageNamespace", _topic_or_namespace)
RULES[f"/{_IA}SetTablePolicy"] = Rule("ManageNamespace", _topic_or_namespace, change=True)
RULES[f"/{_IA}GetTablePolicy"] = Rule("ManageNamespace", _topic_or_namespace)
RULES[f"/{_IA}SetLimits"] = Rule("ManageNamespace", _topic_or_namespace, change=True)
RULES[f"/{_IA}GetLimits"] = Rule("ManageNamespace", _topic_or_namespace)
RULES[f"/{_IA}SetCompression"] = Rule("ManageNamespace", _topic_or_namespace, change=True)
RULES[f"/{_IA}GetCompression"] = Rule("ManageNamespace", _topic_or_namespace)
# stats: what DescribeTopic shows, in numbers; the listing over a namespace, or the cluster when none
RULES[f"/{_IA}GetTopicStats"] = Rule("ManageTopic", T_TOPIC)
RULES[f"/{_IA}ListSubscriptionStats"] = Rule("ManageTopic", _namespace_or_cluster)
# a page of the topic listing: as ListNamespaceTopics for one namespace, the cluster's for every one
RULES[f"/{_IA}ListTopics"] = Rule("ManageTopic", _namespace_or_cluster)
for _m in ("CreateRole", "DeleteRole", "CreateBinding", "DeleteBinding"):
    RULES[f"/{_A}SecurityAdmin/{_m}"] = Rule("ManageCluster", _cluster, change=True)
for _m in ("GetRole", "ListRoles", "GetBinding", "ListBindings", "ListAllBindings"):
    RULES[f"/{_A}SecurityAdmin/{_m}"] = Rule("ManageCluster", _cluster)
# -- cursors and peeking (issue 37) --
RULES[f"/{_I}SeekCursor"] = Rule("Consume", T_TOPIC, change=True)  # as SetCursor
RULES[f"/{_IA}ResetCursor"] = Rule("ManageTopic", T_TOPIC, change=True)
RULES[f"/{_IA}PeekMessages"] = Rule("ManageTopic", T_TOPIC)
# -- unclean recovery (issue 39) --
RULES[f"/{_IA}RecoverTopic"] = Rule("ManageTopic", T_TOPIC, change=True)
RULES[f"/{_IA}DescribeLocalCopy"] = Rule("ManageTopic", T_TOPIC)
