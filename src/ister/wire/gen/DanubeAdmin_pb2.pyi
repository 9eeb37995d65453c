from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DispatchStrategy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NonReliable: _ClassVar[DispatchStrategy]
    Reliable: _ClassVar[DispatchStrategy]

class SubscriptionBackoffStrategy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    Fixed: _ClassVar[SubscriptionBackoffStrategy]
    Exponential: _ClassVar[SubscriptionBackoffStrategy]

class SubscriptionPoisonPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DeadLetter: _ClassVar[SubscriptionPoisonPolicy]
    Block: _ClassVar[SubscriptionPoisonPolicy]
    Drop: _ClassVar[SubscriptionPoisonPolicy]
NonReliable: DispatchStrategy
Reliable: DispatchStrategy
Fixed: SubscriptionBackoffStrategy
Exponential: SubscriptionBackoffStrategy
DeadLetter: SubscriptionPoisonPolicy
Block: SubscriptionPoisonPolicy
Drop: SubscriptionPoisonPolicy

class RoleDefinition(_message.Message):
    __slots__ = ("name", "permissions", "system")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PERMISSIONS_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_FIELD_NUMBER: _ClassVar[int]
    name: str
    permissions: _containers.RepeatedScalarFieldContainer[str]
    system: bool
    def __init__(self, name: _Optional[str] = ..., permissions: _Optional[_Iterable[str]] = ..., system: _Optional[bool] = ...) -> None: ...

class CreateRoleRequest(_message.Message):
    __slots__ = ("role",)
    ROLE_FIELD_NUMBER: _ClassVar[int]
    role: RoleDefinition
    def __init__(self, role: _Optional[_Union[RoleDefinition, _Mapping]] = ...) -> None: ...

class CreateRoleResponse(_message.Message):
    __slots__ = ("success",)
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    success: bool
    def __init__(self, success: _Optional[bool] = ...) -> None: ...

class GetRoleRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class GetRoleResponse(_message.Message):
    __slots__ = ("role",)
    ROLE_FIELD_NUMBER: _ClassVar[int]
    role: RoleDefinition
    def __init__(self, role: _Optional[_Union[RoleDefinition, _Mapping]] = ...) -> None: ...

class ListRolesResponse(_message.Message):
    __slots__ = ("roles",)
    ROLES_FIELD_NUMBER: _ClassVar[int]
    roles: _containers.RepeatedCompositeFieldContainer[RoleDefinition]
    def __init__(self, roles: _Optional[_Iterable[_Union[RoleDefinition, _Mapping]]] = ...) -> None: ...

class DeleteRoleRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteRoleResponse(_message.Message):
    __slots__ = ("success",)
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    success: bool
    def __init__(self, success: _Optional[bool] = ...) -> None: ...

class BindingDefinition(_message.Message):
    __slots__ = ("id", "principal_type", "principal_name", "role_names", "scope", "resource_name")
    ID_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_TYPE_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_NAME_FIELD_NUMBER: _ClassVar[int]
    ROLE_NAMES_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    id: str
    principal_type: str
    principal_name: str
    role_names: _containers.RepeatedScalarFieldContainer[str]
    scope: str
    resource_name: str
    def __init__(self, id: _Optional[str] = ..., principal_type: _Optional[str] = ..., principal_name: _Optional[str] = ..., role_names: _Optional[_Iterable[str]] = ..., scope: _Optional[str] = ..., resource_name: _Optional[str] = ...) -> None: ...

class CreateBindingRequest(_message.Message):
    __slots__ = ("binding",)
    BINDING_FIELD_NUMBER: _ClassVar[int]
    binding: BindingDefinition
    def __init__(self, binding: _Optional[_Union[BindingDefinition, _Mapping]] = ...) -> None: ...

class CreateBindingResponse(_message.Message):
    __slots__ = ("success",)
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    success: bool
    def __init__(self, success: _Optional[bool] = ...) -> None: ...

class GetBindingRequest(_message.Message):
    __slots__ = ("scope", "resource_name", "binding_id")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    BINDING_ID_FIELD_NUMBER: _ClassVar[int]
    scope: str
    resource_name: str
    binding_id: str
    def __init__(self, scope: _Optional[str] = ..., resource_name: _Optional[str] = ..., binding_id: _Optional[str] = ...) -> None: ...

class GetBindingResponse(_message.Message):
    __slots__ = ("binding",)
    BINDING_FIELD_NUMBER: _ClassVar[int]
    binding: BindingDefinition
    def __init__(self, binding: _Optional[_Union[BindingDefinition, _Mapping]] = ...) -> None: ...

class ListBindingsRequest(_message.Message):
    __slots__ = ("scope", "resource_name")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    scope: str
    resource_name: str
    def __init__(self, scope: _Optional[str] = ..., resource_name: _Optional[str] = ...) -> None: ...

class ListBindingsResponse(_message.Message):
    __slots__ = ("bindings",)
    BINDINGS_FIELD_NUMBER: _ClassVar[int]
    bindings: _containers.RepeatedCompositeFieldContainer[BindingDefinition]
    def __init__(self, bindings: _Optional[_Iterable[_Union[BindingDefinition, _Mapping]]] = ...) -> None: ...

class DeleteBindingRequest(_message.Message):
    __slots__ = ("scope", "resource_name", "binding_id")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    BINDING_ID_FIELD_NUMBER: _ClassVar[int]
    scope: str
    resource_name: str
    binding_id: str
    def __init__(self, scope: _Optional[str] = ..., resource_name: _Optional[str] = ..., binding_id: _Optional[str] = ...) -> None: ...

class DeleteBindingResponse(_message.Message):
    __slots__ = ("success",)
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    success: bool
    def __init__(self, success: _Optional[bool] = ...) -> None: ...

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NamespaceRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class NamespaceResponse(_message.Message):
    __slots__ = ("success",)
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    success: bool
    def __init__(self, success: _Optional[bool] = ...) -> None: ...

class NewTopicRequest(_message.Message):
    __slots__ = ("name", "schema_subject", "dispatch_strategy", "replication_factor", "min_insync_replicas")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_SUBJECT_FIELD_NUMBER: _ClassVar[int]
    DISPATCH_STRATEGY_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FACTOR_FIELD_NUMBER: _ClassVar[int]
    MIN_INSYNC_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    name: str
    schema_subject: str
    dispatch_strategy: DispatchStrategy
    replication_factor: int
    min_insync_replicas: int
    def __init__(self, name: _Optional[str] = ..., schema_subject: _Optional[str] = ..., dispatch_strategy: _Optional[_Union[DispatchStrategy, str]] = ..., replication_factor: _Optional[int] = ..., min_insync_replicas: _Optional[int] = ...) -> None: ...

class TopicRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class TopicResponse(_message.Message):
    __slots__ = ("success",)
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    success: bool
    def __init__(self, success: _Optional[bool] = ...) -> None: ...

class PartitionedTopicRequest(_message.Message):
    __slots__ = ("base_name", "partitions", "schema_subject", "dispatch_strategy", "replication_factor", "min_insync_replicas")
    BASE_NAME_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_SUBJECT_FIELD_NUMBER: _ClassVar[int]
    DISPATCH_STRATEGY_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FACTOR_FIELD_NUMBER: _ClassVar[int]
    MIN_INSYNC_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    base_name: str
    partitions: int
    schema_subject: str
    dispatch_strategy: DispatchStrategy
    replication_factor: int
    min_insync_replicas: int
    def __init__(self, base_name: _Optional[str] = ..., partitions: _Optional[int] = ..., schema_subject: _Optional[str] = ..., dispatch_strategy: _Optional[_Union[DispatchStrategy, str]] = ..., replication_factor: _Optional[int] = ..., min_insync_replicas: _Optional[int] = ...) -> None: ...

class SubscriptionRequest(_message.Message):
    __slots__ = ("topic", "subscription")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ...) -> None: ...

class SubscriptionResponse(_message.Message):
    __slots__ = ("success",)
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    success: bool
    def __init__(self, success: _Optional[bool] = ...) -> None: ...

class SubscriptionFailurePolicy(_message.Message):
    __slots__ = ("max_redelivery_count", "ack_timeout_ms", "base_redelivery_delay_ms", "max_redelivery_delay_ms", "backoff_strategy", "dead_letter_topic", "poison_policy")
    MAX_REDELIVERY_COUNT_FIELD_NUMBER: _ClassVar[int]
    ACK_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    BASE_REDELIVERY_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_REDELIVERY_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_STRATEGY_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_TOPIC_FIELD_NUMBER: _ClassVar[int]
    POISON_POLICY_FIELD_NUMBER: _ClassVar[int]
    max_redelivery_count: int
    ack_timeout_ms: int
    base_redelivery_delay_ms: int
    max_redelivery_delay_ms: int
    backoff_strategy: SubscriptionBackoffStrategy
    dead_letter_topic: str
    poison_policy: SubscriptionPoisonPolicy
    def __init__(self, max_redelivery_count: _Optional[int] = ..., ack_timeout_ms: _Optional[int] = ..., base_redelivery_delay_ms: _Optional[int] = ..., max_redelivery_delay_ms: _Optional[int] = ..., backoff_strategy: _Optional[_Union[SubscriptionBackoffStrategy, str]] = ..., dead_letter_topic: _Optional[str] = ..., poison_policy: _Optional[_Union[SubscriptionPoisonPolicy, str]] = ...) -> None: ...

class SetSubscriptionFailurePolicyRequest(_message.Message):
    __slots__ = ("topic", "subscription", "failure_policy")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    FAILURE_POLICY_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    failure_policy: SubscriptionFailurePolicy
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ..., failure_policy: _Optional[_Union[SubscriptionFailurePolicy, _Mapping]] = ...) -> None: ...

class GetSubscriptionFailurePolicyRequest(_message.Message):
    __slots__ = ("topic", "subscription")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ...) -> None: ...

class GetSubscriptionFailurePolicyResponse(_message.Message):
    __slots__ = ("failure_policy", "subscription_type")
    FAILURE_POLICY_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_TYPE_FIELD_NUMBER: _ClassVar[int]
    failure_policy: SubscriptionFailurePolicy
    subscription_type: int
    def __init__(self, failure_policy: _Optional[_Union[SubscriptionFailurePolicy, _Mapping]] = ..., subscription_type: _Optional[int] = ...) -> None: ...

class SubscriptionDispatchConfig(_message.Message):
    __slots__ = ("max_unacked_messages", "rebalance_delay_seconds", "max_handoff_seconds")
    MAX_UNACKED_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    REBALANCE_DELAY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAX_HANDOFF_SECONDS_FIELD_NUMBER: _ClassVar[int]
    max_unacked_messages: int
    rebalance_delay_seconds: float
    max_handoff_seconds: float
    def __init__(self, max_unacked_messages: _Optional[int] = ..., rebalance_delay_seconds: _Optional[float] = ..., max_handoff_seconds: _Optional[float] = ...) -> None: ...

class SetSubscriptionDispatchConfigRequest(_message.Message):
    __slots__ = ("topic", "subscription", "dispatch_config")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    DISPATCH_CONFIG_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    dispatch_config: SubscriptionDispatchConfig
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ..., dispatch_config: _Optional[_Union[SubscriptionDispatchConfig, _Mapping]] = ...) -> None: ...

class GetSubscriptionDispatchConfigRequest(_message.Message):
    __slots__ = ("topic", "subscription")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ...) -> None: ...

class GetSubscriptionDispatchConfigResponse(_message.Message):
    __slots__ = ("dispatch_config",)
    DISPATCH_CONFIG_FIELD_NUMBER: _ClassVar[int]
    dispatch_config: SubscriptionDispatchConfig
    def __init__(self, dispatch_config: _Optional[_Union[SubscriptionDispatchConfig, _Mapping]] = ...) -> None: ...

class BrokerListResponse(_message.Message):
    __slots__ = ("brokers",)
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    brokers: _containers.RepeatedCompositeFieldContainer[BrokerInfo]
    def __init__(self, brokers: _Optional[_Iterable[_Union[BrokerInfo, _Mapping]]] = ...) -> None: ...

class BrokerInfo(_message.Message):
    __slots__ = ("broker_id", "broker_addr", "broker_role", "admin_addr", "metrics_addr", "broker_status")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    BROKER_ADDR_FIELD_NUMBER: _ClassVar[int]
    BROKER_ROLE_FIELD_NUMBER: _ClassVar[int]
    ADMIN_ADDR_FIELD_NUMBER: _ClassVar[int]
    METRICS_ADDR_FIELD_NUMBER: _ClassVar[int]
    BROKER_STATUS_FIELD_NUMBER: _ClassVar[int]
    broker_id: str
    broker_addr: str
    broker_role: str
    admin_addr: str
    metrics_addr: str
    broker_status: str
    def __init__(self, broker_id: _Optional[str] = ..., broker_addr: _Optional[str] = ..., broker_role: _Optional[str] = ..., admin_addr: _Optional[str] = ..., metrics_addr: _Optional[str] = ..., broker_status: _Optional[str] = ...) -> None: ...

class BrokerResponse(_message.Message):
    __slots__ = ("leader",)
    LEADER_FIELD_NUMBER: _ClassVar[int]
    leader: str
    def __init__(self, leader: _Optional[str] = ...) -> None: ...

class NamespaceListResponse(_message.Message):
    __slots__ = ("namespaces",)
    NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    namespaces: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, namespaces: _Optional[_Iterable[str]] = ...) -> None: ...

class TopicListResponse(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, topics: _Optional[_Iterable[str]] = ...) -> None: ...

class TopicInfo(_message.Message):
    __slots__ = ("name", "broker_id", "delivery")
    NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    name: str
    broker_id: str
    delivery: str
    def __init__(self, name: _Optional[str] = ..., broker_id: _Optional[str] = ..., delivery: _Optional[str] = ...) -> None: ...

class TopicInfoListResponse(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[TopicInfo]
    def __init__(self, topics: _Optional[_Iterable[_Union[TopicInfo, _Mapping]]] = ...) -> None: ...

class BrokerRequest(_message.Message):
    __slots__ = ("broker_id",)
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    broker_id: str
    def __init__(self, broker_id: _Optional[str] = ...) -> None: ...

class PolicyResponse(_message.Message):
    __slots__ = ("policies",)
    POLICIES_FIELD_NUMBER: _ClassVar[int]
    policies: str
    def __init__(self, policies: _Optional[str] = ...) -> None: ...

class SubscriptionListResponse(_message.Message):
    __slots__ = ("subscriptions",)
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    subscriptions: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, subscriptions: _Optional[_Iterable[str]] = ...) -> None: ...

class DescribeTopicRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DescribeTopicResponse(_message.Message):
    __slots__ = ("name", "subscriptions", "broker_id", "delivery", "schema_subject", "schema_id", "schema_version", "schema_type", "compatibility_mode", "replicas", "in_sync_replicas", "min_insync_replicas", "leader_epoch", "replica_lag", "attached_consumers", "replication_state")
    class ReplicaLagEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_SUBJECT_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_ID_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_TYPE_FIELD_NUMBER: _ClassVar[int]
    COMPATIBILITY_MODE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    IN_SYNC_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    MIN_INSYNC_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    REPLICA_LAG_FIELD_NUMBER: _ClassVar[int]
    ATTACHED_CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_STATE_FIELD_NUMBER: _ClassVar[int]
    name: str
    subscriptions: _containers.RepeatedScalarFieldContainer[str]
    broker_id: str
    delivery: str
    schema_subject: str
    schema_id: int
    schema_version: int
    schema_type: str
    compatibility_mode: str
    replicas: _containers.RepeatedScalarFieldContainer[int]
    in_sync_replicas: _containers.RepeatedScalarFieldContainer[int]
    min_insync_replicas: int
    leader_epoch: int
    replica_lag: _containers.ScalarMap[int, int]
    attached_consumers: _containers.RepeatedCompositeFieldContainer[AttachedConsumer]
    replication_state: str
    def __init__(self, name: _Optional[str] = ..., subscriptions: _Optional[_Iterable[str]] = ..., broker_id: _Optional[str] = ..., delivery: _Optional[str] = ..., schema_subject: _Optional[str] = ..., schema_id: _Optional[int] = ..., schema_version: _Optional[int] = ..., schema_type: _Optional[str] = ..., compatibility_mode: _Optional[str] = ..., replicas: _Optional[_Iterable[int]] = ..., in_sync_replicas: _Optional[_Iterable[int]] = ..., min_insync_replicas: _Optional[int] = ..., leader_epoch: _Optional[int] = ..., replica_lag: _Optional[_Mapping[int, int]] = ..., attached_consumers: _Optional[_Iterable[_Union[AttachedConsumer, _Mapping]]] = ..., replication_state: _Optional[str] = ...) -> None: ...

class AttachedConsumer(_message.Message):
    __slots__ = ("subscription", "consumer_name")
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_NAME_FIELD_NUMBER: _ClassVar[int]
    subscription: str
    consumer_name: str
    def __init__(self, subscription: _Optional[str] = ..., consumer_name: _Optional[str] = ...) -> None: ...

class UnloadBrokerRequest(_message.Message):
    __slots__ = ("broker_id", "max_parallel", "namespaces_include", "namespaces_exclude", "dry_run", "timeout_seconds")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_PARALLEL_FIELD_NUMBER: _ClassVar[int]
    NAMESPACES_INCLUDE_FIELD_NUMBER: _ClassVar[int]
    NAMESPACES_EXCLUDE_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    broker_id: str
    max_parallel: int
    namespaces_include: _containers.RepeatedScalarFieldContainer[str]
    namespaces_exclude: _containers.RepeatedScalarFieldContainer[str]
    dry_run: bool
    timeout_seconds: int
    def __init__(self, broker_id: _Optional[str] = ..., max_parallel: _Optional[int] = ..., namespaces_include: _Optional[_Iterable[str]] = ..., namespaces_exclude: _Optional[_Iterable[str]] = ..., dry_run: _Optional[bool] = ..., timeout_seconds: _Optional[int] = ...) -> None: ...

class UnloadBrokerResponse(_message.Message):
    __slots__ = ("started", "total", "succeeded", "failed", "pending", "failed_topics")
    STARTED_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    SUCCEEDED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    FAILED_TOPICS_FIELD_NUMBER: _ClassVar[int]
    started: bool
    total: int
    succeeded: int
    failed: int
    pending: int
    failed_topics: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, started: _Optional[bool] = ..., total: _Optional[int] = ..., succeeded: _Optional[int] = ..., failed: _Optional[int] = ..., pending: _Optional[int] = ..., failed_topics: _Optional[_Iterable[str]] = ...) -> None: ...

class ActivateBrokerRequest(_message.Message):
    __slots__ = ("broker_id", "reason")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    broker_id: str
    reason: str
    def __init__(self, broker_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ActivateBrokerResponse(_message.Message):
    __slots__ = ("success",)
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    success: bool
    def __init__(self, success: _Optional[bool] = ...) -> None: ...

class ClusterBalanceRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ClusterBalanceResponse(_message.Message):
    __slots__ = ("coefficient_of_variation", "mean_load", "max_load", "min_load", "std_deviation", "broker_count", "brokers", "assignment_strategy")
    COEFFICIENT_OF_VARIATION_FIELD_NUMBER: _ClassVar[int]
    MEAN_LOAD_FIELD_NUMBER: _ClassVar[int]
    MAX_LOAD_FIELD_NUMBER: _ClassVar[int]
    MIN_LOAD_FIELD_NUMBER: _ClassVar[int]
    STD_DEVIATION_FIELD_NUMBER: _ClassVar[int]
    BROKER_COUNT_FIELD_NUMBER: _ClassVar[int]
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_STRATEGY_FIELD_NUMBER: _ClassVar[int]
    coefficient_of_variation: float
    mean_load: float
    max_load: float
    min_load: float
    std_deviation: float
    broker_count: int
    brokers: _containers.RepeatedCompositeFieldContainer[BrokerLoadInfo]
    assignment_strategy: str
    def __init__(self, coefficient_of_variation: _Optional[float] = ..., mean_load: _Optional[float] = ..., max_load: _Optional[float] = ..., min_load: _Optional[float] = ..., std_deviation: _Optional[float] = ..., broker_count: _Optional[int] = ..., brokers: _Optional[_Iterable[_Union[BrokerLoadInfo, _Mapping]]] = ..., assignment_strategy: _Optional[str] = ...) -> None: ...

class BrokerLoadInfo(_message.Message):
    __slots__ = ("broker_id", "load", "topic_count", "is_overloaded", "is_underloaded")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    TOPIC_COUNT_FIELD_NUMBER: _ClassVar[int]
    IS_OVERLOADED_FIELD_NUMBER: _ClassVar[int]
    IS_UNDERLOADED_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    load: float
    topic_count: int
    is_overloaded: bool
    is_underloaded: bool
    def __init__(self, broker_id: _Optional[int] = ..., load: _Optional[float] = ..., topic_count: _Optional[int] = ..., is_overloaded: _Optional[bool] = ..., is_underloaded: _Optional[bool] = ...) -> None: ...

class RebalanceRequest(_message.Message):
    __slots__ = ("dry_run", "max_moves")
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    MAX_MOVES_FIELD_NUMBER: _ClassVar[int]
    dry_run: bool
    max_moves: int
    def __init__(self, dry_run: _Optional[bool] = ..., max_moves: _Optional[int] = ...) -> None: ...

class RebalanceResponse(_message.Message):
    __slots__ = ("success", "moves_executed", "proposed_moves", "error_message")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    MOVES_EXECUTED_FIELD_NUMBER: _ClassVar[int]
    PROPOSED_MOVES_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    success: bool
    moves_executed: int
    proposed_moves: _containers.RepeatedCompositeFieldContainer[ProposedMove]
    error_message: str
    def __init__(self, success: _Optional[bool] = ..., moves_executed: _Optional[int] = ..., proposed_moves: _Optional[_Iterable[_Union[ProposedMove, _Mapping]]] = ..., error_message: _Optional[str] = ...) -> None: ...

class ProposedMove(_message.Message):
    __slots__ = ("topic_name", "from_broker", "to_broker", "estimated_load", "reason")
    TOPIC_NAME_FIELD_NUMBER: _ClassVar[int]
    FROM_BROKER_FIELD_NUMBER: _ClassVar[int]
    TO_BROKER_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_LOAD_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    topic_name: str
    from_broker: int
    to_broker: int
    estimated_load: float
    reason: str
    def __init__(self, topic_name: _Optional[str] = ..., from_broker: _Optional[int] = ..., to_broker: _Optional[int] = ..., estimated_load: _Optional[float] = ..., reason: _Optional[str] = ...) -> None: ...

class ClusterStatusResponse(_message.Message):
    __slots__ = ("leader_id", "current_term", "last_applied", "voters", "learners", "self_node_id", "raft_addr")
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    CURRENT_TERM_FIELD_NUMBER: _ClassVar[int]
    LAST_APPLIED_FIELD_NUMBER: _ClassVar[int]
    VOTERS_FIELD_NUMBER: _ClassVar[int]
    LEARNERS_FIELD_NUMBER: _ClassVar[int]
    SELF_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    RAFT_ADDR_FIELD_NUMBER: _ClassVar[int]
    leader_id: int
    current_term: int
    last_applied: int
    voters: _containers.RepeatedScalarFieldContainer[int]
    learners: _containers.RepeatedScalarFieldContainer[int]
    self_node_id: int
    raft_addr: str
    def __init__(self, leader_id: _Optional[int] = ..., current_term: _Optional[int] = ..., last_applied: _Optional[int] = ..., voters: _Optional[_Iterable[int]] = ..., learners: _Optional[_Iterable[int]] = ..., self_node_id: _Optional[int] = ..., raft_addr: _Optional[str] = ...) -> None: ...

class AddNodeRequest(_message.Message):
    __slots__ = ("addr", "node_id")
    ADDR_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    addr: str
    node_id: int
    def __init__(self, addr: _Optional[str] = ..., node_id: _Optional[int] = ...) -> None: ...

class AddNodeResponse(_message.Message):
    __slots__ = ("success", "node_id", "message")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    success: bool
    node_id: int
    message: str
    def __init__(self, success: _Optional[bool] = ..., node_id: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class PromoteNodeRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    def __init__(self, node_id: _Optional[int] = ...) -> None: ...

class PromoteNodeResponse(_message.Message):
    __slots__ = ("success", "message")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    success: bool
    message: str
    def __init__(self, success: _Optional[bool] = ..., message: _Optional[str] = ...) -> None: ...

class RemoveNodeRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    def __init__(self, node_id: _Optional[int] = ...) -> None: ...

class RemoveNodeResponse(_message.Message):
    __slots__ = ("success", "message")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    success: bool
    message: str
    def __init__(self, success: _Optional[bool] = ..., message: _Optional[str] = ...) -> None: ...
