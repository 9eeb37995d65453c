from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Delivery(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NON_RELIABLE: _ClassVar[Delivery]
    RELIABLE: _ClassVar[Delivery]

class SubscriptionType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EXCLUSIVE: _ClassVar[SubscriptionType]
    SHARED: _ClassVar[SubscriptionType]
    FAILOVER: _ClassVar[SubscriptionType]
    KEY_SHARED: _ClassVar[SubscriptionType]

class InitialPosition(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LATEST: _ClassVar[InitialPosition]
    EARLIEST: _ClassVar[InitialPosition]
NON_RELIABLE: Delivery
RELIABLE: Delivery
EXCLUSIVE: SubscriptionType
SHARED: SubscriptionType
FAILOVER: SubscriptionType
KEY_SHARED: SubscriptionType
LATEST: InitialPosition
EARLIEST: InitialPosition

class GetCompressionDictionaryRequest(_message.Message):
    __slots__ = ("id", "topic")
    ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    id: int
    topic: str
    def __init__(self, id: _Optional[int] = ..., topic: _Optional[str] = ...) -> None: ...

class GetCompressionDictionaryResponse(_message.Message):
    __slots__ = ("id", "dictionary")
    ID_FIELD_NUMBER: _ClassVar[int]
    DICTIONARY_FIELD_NUMBER: _ClassVar[int]
    id: int
    dictionary: bytes
    def __init__(self, id: _Optional[int] = ..., dictionary: _Optional[bytes] = ...) -> None: ...

class ListTopicsRequest(_message.Message):
    __slots__ = ("namespace", "name_filter", "sort", "descending", "offset", "limit")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FILTER_FIELD_NUMBER: _ClassVar[int]
    SORT_FIELD_NUMBER: _ClassVar[int]
    DESCENDING_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name_filter: str
    sort: str
    descending: bool
    offset: int
    limit: int
    def __init__(self, namespace: _Optional[str] = ..., name_filter: _Optional[str] = ..., sort: _Optional[str] = ..., descending: _Optional[bool] = ..., offset: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class ListedTopic(_message.Message):
    __slots__ = ("name", "broker_id", "delivery")
    NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    name: str
    broker_id: int
    delivery: str
    def __init__(self, name: _Optional[str] = ..., broker_id: _Optional[int] = ..., delivery: _Optional[str] = ...) -> None: ...

class ListTopicsResponse(_message.Message):
    __slots__ = ("topics", "total", "matched", "per_broker", "unassigned", "namespaces")
    class PerBrokerEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    MATCHED_FIELD_NUMBER: _ClassVar[int]
    PER_BROKER_FIELD_NUMBER: _ClassVar[int]
    UNASSIGNED_FIELD_NUMBER: _ClassVar[int]
    NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[ListedTopic]
    total: int
    matched: int
    per_broker: _containers.ScalarMap[int, int]
    unassigned: int
    namespaces: int
    def __init__(self, topics: _Optional[_Iterable[_Union[ListedTopic, _Mapping]]] = ..., total: _Optional[int] = ..., matched: _Optional[int] = ..., per_broker: _Optional[_Mapping[int, int]] = ..., unassigned: _Optional[int] = ..., namespaces: _Optional[int] = ...) -> None: ...

class ClusterHealthRequest(_message.Message):
    __slots__ = ("max_moves",)
    MAX_MOVES_FIELD_NUMBER: _ClassVar[int]
    max_moves: int
    def __init__(self, max_moves: _Optional[int] = ...) -> None: ...

class RebalancingMove(_message.Message):
    __slots__ = ("topic", "from_broker", "to_broker", "reason", "estimated_load", "timestamp")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    FROM_BROKER_FIELD_NUMBER: _ClassVar[int]
    TO_BROKER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_LOAD_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    topic: str
    from_broker: int
    to_broker: int
    reason: str
    estimated_load: float
    timestamp: float
    def __init__(self, topic: _Optional[str] = ..., from_broker: _Optional[int] = ..., to_broker: _Optional[int] = ..., reason: _Optional[str] = ..., estimated_load: _Optional[float] = ..., timestamp: _Optional[float] = ...) -> None: ...

class FailedMove(_message.Message):
    __slots__ = ("topic", "from_broker", "cause", "code", "at", "failures", "backing_off", "retry_at")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    FROM_BROKER_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    BACKING_OFF_FIELD_NUMBER: _ClassVar[int]
    RETRY_AT_FIELD_NUMBER: _ClassVar[int]
    topic: str
    from_broker: int
    cause: str
    code: str
    at: float
    failures: int
    backing_off: bool
    retry_at: float
    def __init__(self, topic: _Optional[str] = ..., from_broker: _Optional[int] = ..., cause: _Optional[str] = ..., code: _Optional[str] = ..., at: _Optional[float] = ..., failures: _Optional[int] = ..., backing_off: _Optional[bool] = ..., retry_at: _Optional[float] = ...) -> None: ...

class ReplicationIssue(_message.Message):
    __slots__ = ("topic", "state", "replicas", "in_sync_replicas", "live_in_sync", "min_insync_replicas", "leader")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    IN_SYNC_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    LIVE_IN_SYNC_FIELD_NUMBER: _ClassVar[int]
    MIN_INSYNC_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    topic: str
    state: str
    replicas: _containers.RepeatedScalarFieldContainer[int]
    in_sync_replicas: _containers.RepeatedScalarFieldContainer[int]
    live_in_sync: _containers.RepeatedScalarFieldContainer[int]
    min_insync_replicas: int
    leader: int
    def __init__(self, topic: _Optional[str] = ..., state: _Optional[str] = ..., replicas: _Optional[_Iterable[int]] = ..., in_sync_replicas: _Optional[_Iterable[int]] = ..., live_in_sync: _Optional[_Iterable[int]] = ..., min_insync_replicas: _Optional[int] = ..., leader: _Optional[int] = ...) -> None: ...

class ClusterHealthResponse(_message.Message):
    __slots__ = ("mode", "note", "moves", "moves_total", "failed_moves", "under_replicated", "under_min_isr", "replicated_topics")
    MODE_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    MOVES_FIELD_NUMBER: _ClassVar[int]
    MOVES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    FAILED_MOVES_FIELD_NUMBER: _ClassVar[int]
    UNDER_REPLICATED_FIELD_NUMBER: _ClassVar[int]
    UNDER_MIN_ISR_FIELD_NUMBER: _ClassVar[int]
    REPLICATED_TOPICS_FIELD_NUMBER: _ClassVar[int]
    mode: str
    note: str
    moves: _containers.RepeatedCompositeFieldContainer[RebalancingMove]
    moves_total: int
    failed_moves: _containers.RepeatedCompositeFieldContainer[FailedMove]
    under_replicated: _containers.RepeatedCompositeFieldContainer[ReplicationIssue]
    under_min_isr: _containers.RepeatedCompositeFieldContainer[ReplicationIssue]
    replicated_topics: int
    def __init__(self, mode: _Optional[str] = ..., note: _Optional[str] = ..., moves: _Optional[_Iterable[_Union[RebalancingMove, _Mapping]]] = ..., moves_total: _Optional[int] = ..., failed_moves: _Optional[_Iterable[_Union[FailedMove, _Mapping]]] = ..., under_replicated: _Optional[_Iterable[_Union[ReplicationIssue, _Mapping]]] = ..., under_min_isr: _Optional[_Iterable[_Union[ReplicationIssue, _Mapping]]] = ..., replicated_topics: _Optional[int] = ...) -> None: ...

class SetCompressionRequest(_message.Message):
    __slots__ = ("namespace", "topic", "compression", "clear", "dictionary")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    CLEAR_FIELD_NUMBER: _ClassVar[int]
    DICTIONARY_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    topic: str
    compression: str
    clear: bool
    dictionary: bool
    def __init__(self, namespace: _Optional[str] = ..., topic: _Optional[str] = ..., compression: _Optional[str] = ..., clear: _Optional[bool] = ..., dictionary: _Optional[bool] = ...) -> None: ...

class GetCompressionRequest(_message.Message):
    __slots__ = ("namespace", "topic")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    topic: str
    def __init__(self, namespace: _Optional[str] = ..., topic: _Optional[str] = ...) -> None: ...

class CompressionResponse(_message.Message):
    __slots__ = ("compression", "source", "dictionary", "dictionary_id")
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    DICTIONARY_FIELD_NUMBER: _ClassVar[int]
    DICTIONARY_ID_FIELD_NUMBER: _ClassVar[int]
    compression: str
    source: str
    dictionary: bool
    dictionary_id: int
    def __init__(self, compression: _Optional[str] = ..., source: _Optional[str] = ..., dictionary: _Optional[bool] = ..., dictionary_id: _Optional[int] = ...) -> None: ...

class SetLimitsRequest(_message.Message):
    __slots__ = ("namespace", "topic", "limits", "clear")
    class LimitsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    CLEAR_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    topic: str
    limits: _containers.ScalarMap[str, int]
    clear: bool
    def __init__(self, namespace: _Optional[str] = ..., topic: _Optional[str] = ..., limits: _Optional[_Mapping[str, int]] = ..., clear: _Optional[bool] = ...) -> None: ...

class GetLimitsRequest(_message.Message):
    __slots__ = ("namespace", "topic")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    topic: str
    def __init__(self, namespace: _Optional[str] = ..., topic: _Optional[str] = ...) -> None: ...

class LimitsResponse(_message.Message):
    __slots__ = ("limits", "sources")
    class LimitsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class SourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    limits: _containers.ScalarMap[str, int]
    sources: _containers.ScalarMap[str, str]
    def __init__(self, limits: _Optional[_Mapping[str, int]] = ..., sources: _Optional[_Mapping[str, str]] = ...) -> None: ...

class RecoverTopicRequest(_message.Message):
    __slots__ = ("topic", "accept_data_loss")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    ACCEPT_DATA_LOSS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    accept_data_loss: bool
    def __init__(self, topic: _Optional[str] = ..., accept_data_loss: _Optional[bool] = ...) -> None: ...

class RecoverTopicResponse(_message.Message):
    __slots__ = ("topic", "leader", "epoch", "kept_end", "resume_at", "acked_end", "survivors")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    KEPT_END_FIELD_NUMBER: _ClassVar[int]
    RESUME_AT_FIELD_NUMBER: _ClassVar[int]
    ACKED_END_FIELD_NUMBER: _ClassVar[int]
    SURVIVORS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    leader: int
    epoch: int
    kept_end: int
    resume_at: int
    acked_end: int
    survivors: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, topic: _Optional[str] = ..., leader: _Optional[int] = ..., epoch: _Optional[int] = ..., kept_end: _Optional[int] = ..., resume_at: _Optional[int] = ..., acked_end: _Optional[int] = ..., survivors: _Optional[_Iterable[int]] = ...) -> None: ...

class LocalCopyRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    def __init__(self, topic: _Optional[str] = ...) -> None: ...

class LocalCopyResponse(_message.Message):
    __slots__ = ("present", "start", "end", "last_epoch", "committed_heard")
    PRESENT_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    LAST_EPOCH_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_HEARD_FIELD_NUMBER: _ClassVar[int]
    present: bool
    start: int
    end: int
    last_epoch: int
    committed_heard: int
    def __init__(self, present: _Optional[bool] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., last_epoch: _Optional[int] = ..., committed_heard: _Optional[int] = ...) -> None: ...

class ReplicaUp(_message.Message):
    __slots__ = ("open", "acked")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    ACKED_FIELD_NUMBER: _ClassVar[int]
    open: ReplicaFetchRequest
    acked: int
    def __init__(self, open: _Optional[_Union[ReplicaFetchRequest, _Mapping]] = ..., acked: _Optional[int] = ...) -> None: ...

class EpochStart(_message.Message):
    __slots__ = ("epoch", "start")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    start: int
    def __init__(self, epoch: _Optional[int] = ..., start: _Optional[int] = ...) -> None: ...

class ReplicaFetchRequest(_message.Message):
    __slots__ = ("topic", "follower", "epoch", "log_start", "log_end", "history", "max_bytes", "wait_ms", "frames_ok")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    FOLLOWER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LOG_START_FIELD_NUMBER: _ClassVar[int]
    LOG_END_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    FRAMES_OK_FIELD_NUMBER: _ClassVar[int]
    topic: str
    follower: int
    epoch: int
    log_start: int
    log_end: int
    history: _containers.RepeatedCompositeFieldContainer[EpochStart]
    max_bytes: int
    wait_ms: int
    frames_ok: bool
    def __init__(self, topic: _Optional[str] = ..., follower: _Optional[int] = ..., epoch: _Optional[int] = ..., log_start: _Optional[int] = ..., log_end: _Optional[int] = ..., history: _Optional[_Iterable[_Union[EpochStart, _Mapping]]] = ..., max_bytes: _Optional[int] = ..., wait_ms: _Optional[int] = ..., frames_ok: _Optional[bool] = ...) -> None: ...

class ReplicaFetchResponse(_message.Message):
    __slots__ = ("epoch", "truncate_to", "reset_to", "first_offset", "records", "epochs", "committed", "frames", "frame_count", "frames_crc", "skip_to")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_TO_FIELD_NUMBER: _ClassVar[int]
    RESET_TO_FIELD_NUMBER: _ClassVar[int]
    FIRST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    FRAME_COUNT_FIELD_NUMBER: _ClassVar[int]
    FRAMES_CRC_FIELD_NUMBER: _ClassVar[int]
    SKIP_TO_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    truncate_to: int
    reset_to: int
    first_offset: int
    records: _containers.RepeatedScalarFieldContainer[bytes]
    epochs: _containers.RepeatedCompositeFieldContainer[EpochStart]
    committed: int
    frames: bytes
    frame_count: int
    frames_crc: int
    skip_to: int
    def __init__(self, epoch: _Optional[int] = ..., truncate_to: _Optional[int] = ..., reset_to: _Optional[int] = ..., first_offset: _Optional[int] = ..., records: _Optional[_Iterable[bytes]] = ..., epochs: _Optional[_Iterable[_Union[EpochStart, _Mapping]]] = ..., committed: _Optional[int] = ..., frames: _Optional[bytes] = ..., frame_count: _Optional[int] = ..., frames_crc: _Optional[int] = ..., skip_to: _Optional[int] = ...) -> None: ...

class ListPartitionAssignmentsRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    def __init__(self, topic: _Optional[str] = ...) -> None: ...

class PartitionAssignment(_message.Message):
    __slots__ = ("subscription", "partition", "consumer", "handing_off_to", "paused_seconds")
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    HANDING_OFF_TO_FIELD_NUMBER: _ClassVar[int]
    PAUSED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    subscription: str
    partition: int
    consumer: str
    handing_off_to: str
    paused_seconds: float
    def __init__(self, subscription: _Optional[str] = ..., partition: _Optional[int] = ..., consumer: _Optional[str] = ..., handing_off_to: _Optional[str] = ..., paused_seconds: _Optional[float] = ...) -> None: ...

class ListPartitionAssignmentsResponse(_message.Message):
    __slots__ = ("assignments",)
    ASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    assignments: _containers.RepeatedCompositeFieldContainer[PartitionAssignment]
    def __init__(self, assignments: _Optional[_Iterable[_Union[PartitionAssignment, _Mapping]]] = ...) -> None: ...

class SetNamespaceReplicationRequest(_message.Message):
    __slots__ = ("namespace", "replication_factor", "min_insync_replicas")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FACTOR_FIELD_NUMBER: _ClassVar[int]
    MIN_INSYNC_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    replication_factor: int
    min_insync_replicas: int
    def __init__(self, namespace: _Optional[str] = ..., replication_factor: _Optional[int] = ..., min_insync_replicas: _Optional[int] = ...) -> None: ...

class SetNamespaceReplicationResponse(_message.Message):
    __slots__ = ("replication_factor", "min_insync_replicas")
    REPLICATION_FACTOR_FIELD_NUMBER: _ClassVar[int]
    MIN_INSYNC_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    replication_factor: int
    min_insync_replicas: int
    def __init__(self, replication_factor: _Optional[int] = ..., min_insync_replicas: _Optional[int] = ...) -> None: ...

class ListBrokerLoadsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BrokerLoadReport(_message.Message):
    __slots__ = ("broker_id", "timestamp", "cpu_percent", "memory_percent", "topics", "message_rate", "throughput_mbps", "followed_topics", "follower_message_rate", "follower_throughput_mbps")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    CPU_PERCENT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_PERCENT_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_RATE_FIELD_NUMBER: _ClassVar[int]
    THROUGHPUT_MBPS_FIELD_NUMBER: _ClassVar[int]
    FOLLOWED_TOPICS_FIELD_NUMBER: _ClassVar[int]
    FOLLOWER_MESSAGE_RATE_FIELD_NUMBER: _ClassVar[int]
    FOLLOWER_THROUGHPUT_MBPS_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    timestamp: int
    cpu_percent: float
    memory_percent: float
    topics: int
    message_rate: int
    throughput_mbps: float
    followed_topics: int
    follower_message_rate: int
    follower_throughput_mbps: float
    def __init__(self, broker_id: _Optional[int] = ..., timestamp: _Optional[int] = ..., cpu_percent: _Optional[float] = ..., memory_percent: _Optional[float] = ..., topics: _Optional[int] = ..., message_rate: _Optional[int] = ..., throughput_mbps: _Optional[float] = ..., followed_topics: _Optional[int] = ..., follower_message_rate: _Optional[int] = ..., follower_throughput_mbps: _Optional[float] = ...) -> None: ...

class ListBrokerLoadsResponse(_message.Message):
    __slots__ = ("brokers",)
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    brokers: _containers.RepeatedCompositeFieldContainer[BrokerLoadReport]
    def __init__(self, brokers: _Optional[_Iterable[_Union[BrokerLoadReport, _Mapping]]] = ...) -> None: ...

class LookupRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    def __init__(self, topic: _Optional[str] = ...) -> None: ...

class LookupResponse(_message.Message):
    __slots__ = ("partitions", "broker_url")
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    BROKER_URL_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedScalarFieldContainer[str]
    broker_url: str
    def __init__(self, partitions: _Optional[_Iterable[str]] = ..., broker_url: _Optional[str] = ...) -> None: ...

class PublishRequest(_message.Message):
    __slots__ = ("open", "batch")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    open: PublishOpen
    batch: PublishBatch
    def __init__(self, open: _Optional[_Union[PublishOpen, _Mapping]] = ..., batch: _Optional[_Union[PublishBatch, _Mapping]] = ...) -> None: ...

class PublishOpen(_message.Message):
    __slots__ = ("topic", "producer_name", "delivery", "schema_subject")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_NAME_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_SUBJECT_FIELD_NUMBER: _ClassVar[int]
    topic: str
    producer_name: str
    delivery: Delivery
    schema_subject: str
    def __init__(self, topic: _Optional[str] = ..., producer_name: _Optional[str] = ..., delivery: _Optional[_Union[Delivery, str]] = ..., schema_subject: _Optional[str] = ...) -> None: ...

class PublishBatch(_message.Message):
    __slots__ = ("sequence", "records", "count", "producer_key", "first_sequence", "codec", "uncompressed_size")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_KEY_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    UNCOMPRESSED_SIZE_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    records: bytes
    count: int
    producer_key: int
    first_sequence: int
    codec: int
    uncompressed_size: int
    def __init__(self, sequence: _Optional[int] = ..., records: _Optional[bytes] = ..., count: _Optional[int] = ..., producer_key: _Optional[int] = ..., first_sequence: _Optional[int] = ..., codec: _Optional[int] = ..., uncompressed_size: _Optional[int] = ...) -> None: ...

class PublishResponse(_message.Message):
    __slots__ = ("opened", "ack")
    OPENED_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    opened: PublishOpened
    ack: PublishAck
    def __init__(self, opened: _Optional[_Union[PublishOpened, _Mapping]] = ..., ack: _Optional[_Union[PublishAck, _Mapping]] = ...) -> None: ...

class PublishOpened(_message.Message):
    __slots__ = ("producer_id", "max_inflight_batches", "max_batch_bytes", "max_batch_count", "dictionary_id")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_INFLIGHT_BATCHES_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_COUNT_FIELD_NUMBER: _ClassVar[int]
    DICTIONARY_ID_FIELD_NUMBER: _ClassVar[int]
    producer_id: int
    max_inflight_batches: int
    max_batch_bytes: int
    max_batch_count: int
    dictionary_id: int
    def __init__(self, producer_id: _Optional[int] = ..., max_inflight_batches: _Optional[int] = ..., max_batch_bytes: _Optional[int] = ..., max_batch_count: _Optional[int] = ..., dictionary_id: _Optional[int] = ...) -> None: ...

class PublishAck(_message.Message):
    __slots__ = ("sequence", "first_offset", "count", "dictionary_id")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    FIRST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    DICTIONARY_ID_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    first_offset: int
    count: int
    dictionary_id: int
    def __init__(self, sequence: _Optional[int] = ..., first_offset: _Optional[int] = ..., count: _Optional[int] = ..., dictionary_id: _Optional[int] = ...) -> None: ...

class ConsumeRequest(_message.Message):
    __slots__ = ("open", "ack", "nack")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    NACK_FIELD_NUMBER: _ClassVar[int]
    open: ConsumeOpen
    ack: Ack
    nack: Nack
    def __init__(self, open: _Optional[_Union[ConsumeOpen, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., nack: _Optional[_Union[Nack, _Mapping]] = ...) -> None: ...

class ConsumeOpen(_message.Message):
    __slots__ = ("topic", "subscription", "consumer_name", "subscription_type", "key_filters", "window", "initial_position", "accept_compressed", "accept_dictionaries")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_NAME_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_TYPE_FIELD_NUMBER: _ClassVar[int]
    KEY_FILTERS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    INITIAL_POSITION_FIELD_NUMBER: _ClassVar[int]
    ACCEPT_COMPRESSED_FIELD_NUMBER: _ClassVar[int]
    ACCEPT_DICTIONARIES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    consumer_name: str
    subscription_type: SubscriptionType
    key_filters: _containers.RepeatedScalarFieldContainer[str]
    window: int
    initial_position: InitialPosition
    accept_compressed: bool
    accept_dictionaries: bool
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ..., consumer_name: _Optional[str] = ..., subscription_type: _Optional[_Union[SubscriptionType, str]] = ..., key_filters: _Optional[_Iterable[str]] = ..., window: _Optional[int] = ..., initial_position: _Optional[_Union[InitialPosition, str]] = ..., accept_compressed: _Optional[bool] = ..., accept_dictionaries: _Optional[bool] = ...) -> None: ...

class OffsetRange(_message.Message):
    __slots__ = ("first", "last")
    FIRST_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    first: int
    last: int
    def __init__(self, first: _Optional[int] = ..., last: _Optional[int] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("ranges", "upto")
    RANGES_FIELD_NUMBER: _ClassVar[int]
    UPTO_FIELD_NUMBER: _ClassVar[int]
    ranges: _containers.RepeatedCompositeFieldContainer[OffsetRange]
    upto: int
    def __init__(self, ranges: _Optional[_Iterable[_Union[OffsetRange, _Mapping]]] = ..., upto: _Optional[int] = ...) -> None: ...

class Nack(_message.Message):
    __slots__ = ("ranges", "delay_ms", "reason")
    RANGES_FIELD_NUMBER: _ClassVar[int]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ranges: _containers.RepeatedCompositeFieldContainer[OffsetRange]
    delay_ms: int
    reason: str
    def __init__(self, ranges: _Optional[_Iterable[_Union[OffsetRange, _Mapping]]] = ..., delay_ms: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class ConsumeResponse(_message.Message):
    __slots__ = ("opened", "batch")
    OPENED_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    opened: ConsumeOpened
    batch: MessageBatch
    def __init__(self, opened: _Optional[_Union[ConsumeOpened, _Mapping]] = ..., batch: _Optional[_Union[MessageBatch, _Mapping]] = ...) -> None: ...

class ConsumeOpened(_message.Message):
    __slots__ = ("consumer_id", "window", "cursor_epoch")
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    CURSOR_EPOCH_FIELD_NUMBER: _ClassVar[int]
    consumer_id: int
    window: int
    cursor_epoch: int
    def __init__(self, consumer_id: _Optional[int] = ..., window: _Optional[int] = ..., cursor_epoch: _Optional[int] = ...) -> None: ...

class MessageBatch(_message.Message):
    __slots__ = ("frames", "count")
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    frames: bytes
    count: int
    def __init__(self, frames: _Optional[bytes] = ..., count: _Optional[int] = ...) -> None: ...

class OffsetsRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    def __init__(self, topic: _Optional[str] = ...) -> None: ...

class OffsetsResponse(_message.Message):
    __slots__ = ("earliest", "next", "durable_url", "object_prefix")
    EARLIEST_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    DURABLE_URL_FIELD_NUMBER: _ClassVar[int]
    OBJECT_PREFIX_FIELD_NUMBER: _ClassVar[int]
    earliest: int
    next: int
    durable_url: str
    object_prefix: str
    def __init__(self, earliest: _Optional[int] = ..., next: _Optional[int] = ..., durable_url: _Optional[str] = ..., object_prefix: _Optional[str] = ...) -> None: ...

class ReadRequest(_message.Message):
    __slots__ = ("topic", "start", "end", "max_records", "accept_compressed", "accept_dictionaries")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    MAX_RECORDS_FIELD_NUMBER: _ClassVar[int]
    ACCEPT_COMPRESSED_FIELD_NUMBER: _ClassVar[int]
    ACCEPT_DICTIONARIES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    start: int
    end: int
    max_records: int
    accept_compressed: bool
    accept_dictionaries: bool
    def __init__(self, topic: _Optional[str] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., max_records: _Optional[int] = ..., accept_compressed: _Optional[bool] = ..., accept_dictionaries: _Optional[bool] = ...) -> None: ...

class SetCursorRequest(_message.Message):
    __slots__ = ("topic", "subscription", "next")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    next: int
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ..., next: _Optional[int] = ...) -> None: ...

class SetCursorResponse(_message.Message):
    __slots__ = ("lag",)
    LAG_FIELD_NUMBER: _ClassVar[int]
    lag: int
    def __init__(self, lag: _Optional[int] = ...) -> None: ...

class ExchangeApiKeyRequest(_message.Message):
    __slots__ = ("api_key", "ttl_seconds")
    API_KEY_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    api_key: str
    ttl_seconds: int
    def __init__(self, api_key: _Optional[str] = ..., ttl_seconds: _Optional[int] = ...) -> None: ...

class ExchangeApiKeyResponse(_message.Message):
    __slots__ = ("token", "expires_at_ms", "principal")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    token: str
    expires_at_ms: int
    principal: str
    def __init__(self, token: _Optional[str] = ..., expires_at_ms: _Optional[int] = ..., principal: _Optional[str] = ...) -> None: ...

class ApiKeyInfo(_message.Message):
    __slots__ = ("id", "principal_type", "principal_name", "description", "created_at_ms")
    ID_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_TYPE_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    id: str
    principal_type: str
    principal_name: str
    description: str
    created_at_ms: int
    def __init__(self, id: _Optional[str] = ..., principal_type: _Optional[str] = ..., principal_name: _Optional[str] = ..., description: _Optional[str] = ..., created_at_ms: _Optional[int] = ...) -> None: ...

class CreateApiKeyRequest(_message.Message):
    __slots__ = ("principal_name", "principal_type", "description")
    PRINCIPAL_NAME_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_TYPE_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    principal_name: str
    principal_type: str
    description: str
    def __init__(self, principal_name: _Optional[str] = ..., principal_type: _Optional[str] = ..., description: _Optional[str] = ...) -> None: ...

class CreateApiKeyResponse(_message.Message):
    __slots__ = ("key", "api_key")
    KEY_FIELD_NUMBER: _ClassVar[int]
    API_KEY_FIELD_NUMBER: _ClassVar[int]
    key: ApiKeyInfo
    api_key: str
    def __init__(self, key: _Optional[_Union[ApiKeyInfo, _Mapping]] = ..., api_key: _Optional[str] = ...) -> None: ...

class ListApiKeysRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListApiKeysResponse(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedCompositeFieldContainer[ApiKeyInfo]
    def __init__(self, keys: _Optional[_Iterable[_Union[ApiKeyInfo, _Mapping]]] = ...) -> None: ...

class RevokeApiKeyRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class RevokeApiKeyResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CreateTokenRequest(_message.Message):
    __slots__ = ("principal_name", "principal_type", "ttl_seconds")
    PRINCIPAL_NAME_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_TYPE_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    principal_name: str
    principal_type: str
    ttl_seconds: int
    def __init__(self, principal_name: _Optional[str] = ..., principal_type: _Optional[str] = ..., ttl_seconds: _Optional[int] = ...) -> None: ...

class CreateTokenResponse(_message.Message):
    __slots__ = ("token", "expires_at_ms", "principal")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    token: str
    expires_at_ms: int
    principal: str
    def __init__(self, token: _Optional[str] = ..., expires_at_ms: _Optional[int] = ..., principal: _Optional[str] = ...) -> None: ...

class SetRetentionRequest(_message.Message):
    __slots__ = ("namespace", "topic", "time_ms", "size_bytes", "clear", "backlog_quota_size_bytes", "backlog_quota_time_ms", "backlog_quota_policy", "message_ttl_ms")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    TIME_MS_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CLEAR_FIELD_NUMBER: _ClassVar[int]
    BACKLOG_QUOTA_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    BACKLOG_QUOTA_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    BACKLOG_QUOTA_POLICY_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    topic: str
    time_ms: int
    size_bytes: int
    clear: bool
    backlog_quota_size_bytes: int
    backlog_quota_time_ms: int
    backlog_quota_policy: str
    message_ttl_ms: int
    def __init__(self, namespace: _Optional[str] = ..., topic: _Optional[str] = ..., time_ms: _Optional[int] = ..., size_bytes: _Optional[int] = ..., clear: _Optional[bool] = ..., backlog_quota_size_bytes: _Optional[int] = ..., backlog_quota_time_ms: _Optional[int] = ..., backlog_quota_policy: _Optional[str] = ..., message_ttl_ms: _Optional[int] = ...) -> None: ...

class GetRetentionRequest(_message.Message):
    __slots__ = ("namespace", "topic")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    topic: str
    def __init__(self, namespace: _Optional[str] = ..., topic: _Optional[str] = ...) -> None: ...

class RetentionResponse(_message.Message):
    __slots__ = ("time_ms", "size_bytes", "time_source", "size_source", "start_offset", "backlog_quota_size_bytes", "backlog_quota_time_ms", "backlog_quota_policy", "message_ttl_ms")
    TIME_MS_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TIME_SOURCE_FIELD_NUMBER: _ClassVar[int]
    SIZE_SOURCE_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    BACKLOG_QUOTA_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    BACKLOG_QUOTA_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    BACKLOG_QUOTA_POLICY_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    time_ms: int
    size_bytes: int
    time_source: str
    size_source: str
    start_offset: int
    backlog_quota_size_bytes: int
    backlog_quota_time_ms: int
    backlog_quota_policy: str
    message_ttl_ms: int
    def __init__(self, time_ms: _Optional[int] = ..., size_bytes: _Optional[int] = ..., time_source: _Optional[str] = ..., size_source: _Optional[str] = ..., start_offset: _Optional[int] = ..., backlog_quota_size_bytes: _Optional[int] = ..., backlog_quota_time_ms: _Optional[int] = ..., backlog_quota_policy: _Optional[str] = ..., message_ttl_ms: _Optional[int] = ...) -> None: ...

class SetTablePolicyRequest(_message.Message):
    __slots__ = ("namespace", "topic", "format", "partition", "interval_ms", "clear")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    CLEAR_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    topic: str
    format: str
    partition: str
    interval_ms: int
    clear: bool
    def __init__(self, namespace: _Optional[str] = ..., topic: _Optional[str] = ..., format: _Optional[str] = ..., partition: _Optional[str] = ..., interval_ms: _Optional[int] = ..., clear: _Optional[bool] = ...) -> None: ...

class GetTablePolicyRequest(_message.Message):
    __slots__ = ("namespace", "topic")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    topic: str
    def __init__(self, namespace: _Optional[str] = ..., topic: _Optional[str] = ...) -> None: ...

class TablePolicyResponse(_message.Message):
    __slots__ = ("format", "partition", "interval_ms", "format_source", "partition_source", "interval_source", "catalog_uri", "tables", "properties")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    FORMAT_SOURCE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_SOURCE_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_SOURCE_FIELD_NUMBER: _ClassVar[int]
    CATALOG_URI_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    format: str
    partition: str
    interval_ms: int
    format_source: str
    partition_source: str
    interval_source: str
    catalog_uri: str
    tables: _containers.RepeatedScalarFieldContainer[str]
    properties: _containers.ScalarMap[str, str]
    def __init__(self, format: _Optional[str] = ..., partition: _Optional[str] = ..., interval_ms: _Optional[int] = ..., format_source: _Optional[str] = ..., partition_source: _Optional[str] = ..., interval_source: _Optional[str] = ..., catalog_uri: _Optional[str] = ..., tables: _Optional[_Iterable[str]] = ..., properties: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ResetCursorRequest(_message.Message):
    __slots__ = ("topic", "subscription", "earliest", "latest", "offset", "time_ms", "dry_run")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    EARLIEST_FIELD_NUMBER: _ClassVar[int]
    LATEST_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TIME_MS_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    earliest: bool
    latest: bool
    offset: int
    time_ms: int
    dry_run: bool
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ..., earliest: _Optional[bool] = ..., latest: _Optional[bool] = ..., offset: _Optional[int] = ..., time_ms: _Optional[int] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class CursorPosition(_message.Message):
    __slots__ = ("topic", "next", "head", "consumers", "epoch")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    topic: str
    next: int
    head: int
    consumers: int
    epoch: int
    def __init__(self, topic: _Optional[str] = ..., next: _Optional[int] = ..., head: _Optional[int] = ..., consumers: _Optional[int] = ..., epoch: _Optional[int] = ...) -> None: ...

class ResetCursorResponse(_message.Message):
    __slots__ = ("positions",)
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    positions: _containers.RepeatedCompositeFieldContainer[CursorPosition]
    def __init__(self, positions: _Optional[_Iterable[_Union[CursorPosition, _Mapping]]] = ...) -> None: ...

class PeekMessagesRequest(_message.Message):
    __slots__ = ("topic", "offset", "time_ms", "count")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TIME_MS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    topic: str
    offset: int
    time_ms: int
    count: int
    def __init__(self, topic: _Optional[str] = ..., offset: _Optional[int] = ..., time_ms: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...

class PeekedMessage(_message.Message):
    __slots__ = ("topic", "offset", "payload", "publish_time", "producer_name", "producer_id", "attributes", "routing_key", "schema_id", "schema_version", "schema_subject", "schema_type", "value_json", "decode_error")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_TIME_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_NAME_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    ROUTING_KEY_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_ID_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_SUBJECT_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_TYPE_FIELD_NUMBER: _ClassVar[int]
    VALUE_JSON_FIELD_NUMBER: _ClassVar[int]
    DECODE_ERROR_FIELD_NUMBER: _ClassVar[int]
    topic: str
    offset: int
    payload: bytes
    publish_time: int
    producer_name: str
    producer_id: int
    attributes: _containers.ScalarMap[str, str]
    routing_key: str
    schema_id: int
    schema_version: int
    schema_subject: str
    schema_type: str
    value_json: str
    decode_error: str
    def __init__(self, topic: _Optional[str] = ..., offset: _Optional[int] = ..., payload: _Optional[bytes] = ..., publish_time: _Optional[int] = ..., producer_name: _Optional[str] = ..., producer_id: _Optional[int] = ..., attributes: _Optional[_Mapping[str, str]] = ..., routing_key: _Optional[str] = ..., schema_id: _Optional[int] = ..., schema_version: _Optional[int] = ..., schema_subject: _Optional[str] = ..., schema_type: _Optional[str] = ..., value_json: _Optional[str] = ..., decode_error: _Optional[str] = ...) -> None: ...

class PeekMessagesResponse(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[PeekedMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[PeekedMessage, _Mapping]]] = ...) -> None: ...

class TopicStatsRequest(_message.Message):
    __slots__ = ("topic", "local")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    LOCAL_FIELD_NUMBER: _ClassVar[int]
    topic: str
    local: bool
    def __init__(self, topic: _Optional[str] = ..., local: _Optional[bool] = ...) -> None: ...

class TopicStatsResponse(_message.Message):
    __slots__ = ("total", "partitions")
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    total: TopicStats
    partitions: _containers.RepeatedCompositeFieldContainer[TopicStats]
    def __init__(self, total: _Optional[_Union[TopicStats, _Mapping]] = ..., partitions: _Optional[_Iterable[_Union[TopicStats, _Mapping]]] = ...) -> None: ...

class TopicStats(_message.Message):
    __slots__ = ("topic", "delivery", "owner_broker_id", "msg_rate_in", "byte_rate_in", "msg_rate_out", "byte_rate_out", "rate_window_seconds", "messages_in_total", "bytes_in_total", "messages_out_total", "bytes_out_total", "start_offset", "end_offset", "message_count", "storage", "replication", "producers", "subscriptions", "warnings")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    OWNER_BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    MSG_RATE_IN_FIELD_NUMBER: _ClassVar[int]
    BYTE_RATE_IN_FIELD_NUMBER: _ClassVar[int]
    MSG_RATE_OUT_FIELD_NUMBER: _ClassVar[int]
    BYTE_RATE_OUT_FIELD_NUMBER: _ClassVar[int]
    RATE_WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_IN_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BYTES_IN_TOTAL_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_OUT_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BYTES_OUT_TOTAL_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_COUNT_FIELD_NUMBER: _ClassVar[int]
    STORAGE_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FIELD_NUMBER: _ClassVar[int]
    PRODUCERS_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    delivery: str
    owner_broker_id: str
    msg_rate_in: float
    byte_rate_in: float
    msg_rate_out: float
    byte_rate_out: float
    rate_window_seconds: float
    messages_in_total: int
    bytes_in_total: int
    messages_out_total: int
    bytes_out_total: int
    start_offset: int
    end_offset: int
    message_count: int
    storage: StorageStats
    replication: ReplicationStats
    producers: _containers.RepeatedCompositeFieldContainer[ProducerStats]
    subscriptions: _containers.RepeatedCompositeFieldContainer[SubscriptionStatsEntry]
    warnings: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, topic: _Optional[str] = ..., delivery: _Optional[str] = ..., owner_broker_id: _Optional[str] = ..., msg_rate_in: _Optional[float] = ..., byte_rate_in: _Optional[float] = ..., msg_rate_out: _Optional[float] = ..., byte_rate_out: _Optional[float] = ..., rate_window_seconds: _Optional[float] = ..., messages_in_total: _Optional[int] = ..., bytes_in_total: _Optional[int] = ..., messages_out_total: _Optional[int] = ..., bytes_out_total: _Optional[int] = ..., start_offset: _Optional[int] = ..., end_offset: _Optional[int] = ..., message_count: _Optional[int] = ..., storage: _Optional[_Union[StorageStats, _Mapping]] = ..., replication: _Optional[_Union[ReplicationStats, _Mapping]] = ..., producers: _Optional[_Iterable[_Union[ProducerStats, _Mapping]]] = ..., subscriptions: _Optional[_Iterable[_Union[SubscriptionStatsEntry, _Mapping]]] = ..., warnings: _Optional[_Iterable[str]] = ...) -> None: ...

class StorageStats(_message.Message):
    __slots__ = ("wal_bytes", "wal_segments", "object_bytes", "objects", "parquet_bytes", "parquet_files", "total_bytes")
    WAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    WAL_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    OBJECT_BYTES_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_FIELD_NUMBER: _ClassVar[int]
    PARQUET_BYTES_FIELD_NUMBER: _ClassVar[int]
    PARQUET_FILES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    wal_bytes: int
    wal_segments: int
    object_bytes: int
    objects: int
    parquet_bytes: int
    parquet_files: int
    total_bytes: int
    def __init__(self, wal_bytes: _Optional[int] = ..., wal_segments: _Optional[int] = ..., object_bytes: _Optional[int] = ..., objects: _Optional[int] = ..., parquet_bytes: _Optional[int] = ..., parquet_files: _Optional[int] = ..., total_bytes: _Optional[int] = ...) -> None: ...

class ReplicationStats(_message.Message):
    __slots__ = ("replicas", "in_sync", "min_insync", "leader_epoch", "follower_lag")
    class FollowerLagEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    IN_SYNC_FIELD_NUMBER: _ClassVar[int]
    MIN_INSYNC_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    FOLLOWER_LAG_FIELD_NUMBER: _ClassVar[int]
    replicas: _containers.RepeatedScalarFieldContainer[str]
    in_sync: _containers.RepeatedScalarFieldContainer[str]
    min_insync: int
    leader_epoch: int
    follower_lag: _containers.ScalarMap[str, int]
    def __init__(self, replicas: _Optional[_Iterable[str]] = ..., in_sync: _Optional[_Iterable[str]] = ..., min_insync: _Optional[int] = ..., leader_epoch: _Optional[int] = ..., follower_lag: _Optional[_Mapping[str, int]] = ...) -> None: ...

class ProducerStats(_message.Message):
    __slots__ = ("producer_id", "name", "address", "connected_since_ms", "msg_rate_in", "byte_rate_in", "messages_total", "bytes_total")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    MSG_RATE_IN_FIELD_NUMBER: _ClassVar[int]
    BYTE_RATE_IN_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    producer_id: str
    name: str
    address: str
    connected_since_ms: int
    msg_rate_in: float
    byte_rate_in: float
    messages_total: int
    bytes_total: int
    def __init__(self, producer_id: _Optional[str] = ..., name: _Optional[str] = ..., address: _Optional[str] = ..., connected_since_ms: _Optional[int] = ..., msg_rate_in: _Optional[float] = ..., byte_rate_in: _Optional[float] = ..., messages_total: _Optional[int] = ..., bytes_total: _Optional[int] = ...) -> None: ...

class ConsumerStats(_message.Message):
    __slots__ = ("consumer_id", "name", "address", "connected_since_ms", "connected", "unacked")
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    UNACKED_FIELD_NUMBER: _ClassVar[int]
    consumer_id: str
    name: str
    address: str
    connected_since_ms: int
    connected: bool
    unacked: int
    def __init__(self, consumer_id: _Optional[str] = ..., name: _Optional[str] = ..., address: _Optional[str] = ..., connected_since_ms: _Optional[int] = ..., connected: _Optional[bool] = ..., unacked: _Optional[int] = ...) -> None: ...

class SubscriptionStatsEntry(_message.Message):
    __slots__ = ("topic", "subscription", "type", "cursor", "next_offset", "backlog_messages", "backlog_bytes", "lag_ms", "unacked_in_flight", "waiting_redelivery", "redeliveries_total", "dead_lettered_total", "msg_rate_out", "byte_rate_out", "consumers", "live", "owner_broker_id", "delivery")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    BACKLOG_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    BACKLOG_BYTES_FIELD_NUMBER: _ClassVar[int]
    LAG_MS_FIELD_NUMBER: _ClassVar[int]
    UNACKED_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    WAITING_REDELIVERY_FIELD_NUMBER: _ClassVar[int]
    REDELIVERIES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    MSG_RATE_OUT_FIELD_NUMBER: _ClassVar[int]
    BYTE_RATE_OUT_FIELD_NUMBER: _ClassVar[int]
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    LIVE_FIELD_NUMBER: _ClassVar[int]
    OWNER_BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    type: str
    cursor: int
    next_offset: int
    backlog_messages: int
    backlog_bytes: int
    lag_ms: int
    unacked_in_flight: int
    waiting_redelivery: int
    redeliveries_total: int
    dead_lettered_total: int
    msg_rate_out: float
    byte_rate_out: float
    consumers: _containers.RepeatedCompositeFieldContainer[ConsumerStats]
    live: bool
    owner_broker_id: str
    delivery: str
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ..., type: _Optional[str] = ..., cursor: _Optional[int] = ..., next_offset: _Optional[int] = ..., backlog_messages: _Optional[int] = ..., backlog_bytes: _Optional[int] = ..., lag_ms: _Optional[int] = ..., unacked_in_flight: _Optional[int] = ..., waiting_redelivery: _Optional[int] = ..., redeliveries_total: _Optional[int] = ..., dead_lettered_total: _Optional[int] = ..., msg_rate_out: _Optional[float] = ..., byte_rate_out: _Optional[float] = ..., consumers: _Optional[_Iterable[_Union[ConsumerStats, _Mapping]]] = ..., live: _Optional[bool] = ..., owner_broker_id: _Optional[str] = ..., delivery: _Optional[str] = ...) -> None: ...

class ListSubscriptionStatsRequest(_message.Message):
    __slots__ = ("namespace", "lagging", "local", "totals_only")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    LAGGING_FIELD_NUMBER: _ClassVar[int]
    LOCAL_FIELD_NUMBER: _ClassVar[int]
    TOTALS_ONLY_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    lagging: bool
    local: bool
    totals_only: bool
    def __init__(self, namespace: _Optional[str] = ..., lagging: _Optional[bool] = ..., local: _Optional[bool] = ..., totals_only: _Optional[bool] = ...) -> None: ...

class SubscriptionTotals(_message.Message):
    __slots__ = ("msg_rate_out", "byte_rate_out", "subscriptions", "lagging")
    MSG_RATE_OUT_FIELD_NUMBER: _ClassVar[int]
    BYTE_RATE_OUT_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    LAGGING_FIELD_NUMBER: _ClassVar[int]
    msg_rate_out: float
    byte_rate_out: float
    subscriptions: int
    lagging: int
    def __init__(self, msg_rate_out: _Optional[float] = ..., byte_rate_out: _Optional[float] = ..., subscriptions: _Optional[int] = ..., lagging: _Optional[int] = ...) -> None: ...

class BrokerFailure(_message.Message):
    __slots__ = ("broker_id", "error")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    broker_id: str
    error: str
    def __init__(self, broker_id: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...

class ListSubscriptionStatsResponse(_message.Message):
    __slots__ = ("subscriptions", "failed_brokers", "totals")
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    FAILED_BROKERS_FIELD_NUMBER: _ClassVar[int]
    TOTALS_FIELD_NUMBER: _ClassVar[int]
    subscriptions: _containers.RepeatedCompositeFieldContainer[SubscriptionStatsEntry]
    failed_brokers: _containers.RepeatedCompositeFieldContainer[BrokerFailure]
    totals: SubscriptionTotals
    def __init__(self, subscriptions: _Optional[_Iterable[_Union[SubscriptionStatsEntry, _Mapping]]] = ..., failed_brokers: _Optional[_Iterable[_Union[BrokerFailure, _Mapping]]] = ..., totals: _Optional[_Union[SubscriptionTotals, _Mapping]] = ...) -> None: ...
