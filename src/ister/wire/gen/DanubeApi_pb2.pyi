from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProducerAccessMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    Shared: _ClassVar[ProducerAccessMode]
    Exclusive: _ClassVar[ProducerAccessMode]

class DispatchStrategy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NonReliable: _ClassVar[DispatchStrategy]
    Reliable: _ClassVar[DispatchStrategy]
Shared: ProducerAccessMode
Exclusive: ProducerAccessMode
NonReliable: DispatchStrategy
Reliable: DispatchStrategy

class ProducerRequest(_message.Message):
    __slots__ = ("request_id", "producer_name", "topic_name", "schema_ref", "producer_access_mode", "dispatch_strategy")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_NAME_FIELD_NUMBER: _ClassVar[int]
    TOPIC_NAME_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_REF_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ACCESS_MODE_FIELD_NUMBER: _ClassVar[int]
    DISPATCH_STRATEGY_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    producer_name: str
    topic_name: str
    schema_ref: SchemaReference
    producer_access_mode: ProducerAccessMode
    dispatch_strategy: DispatchStrategy
    def __init__(self, request_id: _Optional[int] = ..., producer_name: _Optional[str] = ..., topic_name: _Optional[str] = ..., schema_ref: _Optional[_Union[SchemaReference, _Mapping]] = ..., producer_access_mode: _Optional[_Union[ProducerAccessMode, str]] = ..., dispatch_strategy: _Optional[_Union[DispatchStrategy, str]] = ...) -> None: ...

class SchemaReference(_message.Message):
    __slots__ = ("subject", "use_latest", "pinned_version", "min_version")
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    USE_LATEST_FIELD_NUMBER: _ClassVar[int]
    PINNED_VERSION_FIELD_NUMBER: _ClassVar[int]
    MIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    subject: str
    use_latest: bool
    pinned_version: int
    min_version: int
    def __init__(self, subject: _Optional[str] = ..., use_latest: _Optional[bool] = ..., pinned_version: _Optional[int] = ..., min_version: _Optional[int] = ...) -> None: ...

class ProducerResponse(_message.Message):
    __slots__ = ("request_id", "producer_id", "producer_name")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_NAME_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    producer_id: int
    producer_name: str
    def __init__(self, request_id: _Optional[int] = ..., producer_id: _Optional[int] = ..., producer_name: _Optional[str] = ...) -> None: ...

class MessageResponse(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    def __init__(self, request_id: _Optional[int] = ...) -> None: ...

class ConsumerRequest(_message.Message):
    __slots__ = ("request_id", "topic_name", "consumer_name", "subscription", "subscription_type", "key_filters")
    class SubscriptionType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        Exclusive: _ClassVar[ConsumerRequest.SubscriptionType]
        Shared: _ClassVar[ConsumerRequest.SubscriptionType]
        Failover: _ClassVar[ConsumerRequest.SubscriptionType]
        KeyShared: _ClassVar[ConsumerRequest.SubscriptionType]
    Exclusive: ConsumerRequest.SubscriptionType
    Shared: ConsumerRequest.SubscriptionType
    Failover: ConsumerRequest.SubscriptionType
    KeyShared: ConsumerRequest.SubscriptionType
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_NAME_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_NAME_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_TYPE_FIELD_NUMBER: _ClassVar[int]
    KEY_FILTERS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    topic_name: str
    consumer_name: str
    subscription: str
    subscription_type: ConsumerRequest.SubscriptionType
    key_filters: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request_id: _Optional[int] = ..., topic_name: _Optional[str] = ..., consumer_name: _Optional[str] = ..., subscription: _Optional[str] = ..., subscription_type: _Optional[_Union[ConsumerRequest.SubscriptionType, str]] = ..., key_filters: _Optional[_Iterable[str]] = ...) -> None: ...

class ConsumerResponse(_message.Message):
    __slots__ = ("request_id", "consumer_id", "consumer_name")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_NAME_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    consumer_id: int
    consumer_name: str
    def __init__(self, request_id: _Optional[int] = ..., consumer_id: _Optional[int] = ..., consumer_name: _Optional[str] = ...) -> None: ...

class ReceiveRequest(_message.Message):
    __slots__ = ("request_id", "consumer_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    consumer_id: int
    def __init__(self, request_id: _Optional[int] = ..., consumer_id: _Optional[int] = ...) -> None: ...

class StreamMessage(_message.Message):
    __slots__ = ("request_id", "msg_id", "payload", "publish_time", "producer_name", "subscription_name", "attributes", "schema_id", "schema_version", "routing_key")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_TIME_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_NAME_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_NAME_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_ID_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    ROUTING_KEY_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    msg_id: MsgID
    payload: bytes
    publish_time: int
    producer_name: str
    subscription_name: str
    attributes: _containers.ScalarMap[str, str]
    schema_id: int
    schema_version: int
    routing_key: str
    def __init__(self, request_id: _Optional[int] = ..., msg_id: _Optional[_Union[MsgID, _Mapping]] = ..., payload: _Optional[bytes] = ..., publish_time: _Optional[int] = ..., producer_name: _Optional[str] = ..., subscription_name: _Optional[str] = ..., attributes: _Optional[_Mapping[str, str]] = ..., schema_id: _Optional[int] = ..., schema_version: _Optional[int] = ..., routing_key: _Optional[str] = ...) -> None: ...

class MsgID(_message.Message):
    __slots__ = ("producer_id", "topic_name", "broker_addr", "topic_offset")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_ADDR_FIELD_NUMBER: _ClassVar[int]
    TOPIC_OFFSET_FIELD_NUMBER: _ClassVar[int]
    producer_id: int
    topic_name: str
    broker_addr: str
    topic_offset: int
    def __init__(self, producer_id: _Optional[int] = ..., topic_name: _Optional[str] = ..., broker_addr: _Optional[str] = ..., topic_offset: _Optional[int] = ...) -> None: ...

class AckRequest(_message.Message):
    __slots__ = ("request_id", "msg_id", "subscription_name")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_NAME_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    msg_id: MsgID
    subscription_name: str
    def __init__(self, request_id: _Optional[int] = ..., msg_id: _Optional[_Union[MsgID, _Mapping]] = ..., subscription_name: _Optional[str] = ...) -> None: ...

class AckResponse(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    def __init__(self, request_id: _Optional[int] = ...) -> None: ...

class NackRequest(_message.Message):
    __slots__ = ("request_id", "msg_id", "subscription_name", "delay_ms", "reason")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_NAME_FIELD_NUMBER: _ClassVar[int]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    msg_id: MsgID
    subscription_name: str
    delay_ms: int
    reason: str
    def __init__(self, request_id: _Optional[int] = ..., msg_id: _Optional[_Union[MsgID, _Mapping]] = ..., subscription_name: _Optional[str] = ..., delay_ms: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class NackResponse(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    def __init__(self, request_id: _Optional[int] = ...) -> None: ...

class TopicLookupRequest(_message.Message):
    __slots__ = ("request_id", "topic")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    topic: str
    def __init__(self, request_id: _Optional[int] = ..., topic: _Optional[str] = ...) -> None: ...

class TopicLookupResponse(_message.Message):
    __slots__ = ("request_id", "response_type", "connect_url", "broker_url", "proxy")
    class LookupType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        Redirect: _ClassVar[TopicLookupResponse.LookupType]
        Connect: _ClassVar[TopicLookupResponse.LookupType]
        Failed: _ClassVar[TopicLookupResponse.LookupType]
    Redirect: TopicLookupResponse.LookupType
    Connect: TopicLookupResponse.LookupType
    Failed: TopicLookupResponse.LookupType
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_TYPE_FIELD_NUMBER: _ClassVar[int]
    CONNECT_URL_FIELD_NUMBER: _ClassVar[int]
    BROKER_URL_FIELD_NUMBER: _ClassVar[int]
    PROXY_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    response_type: TopicLookupResponse.LookupType
    connect_url: str
    broker_url: str
    proxy: bool
    def __init__(self, request_id: _Optional[int] = ..., response_type: _Optional[_Union[TopicLookupResponse.LookupType, str]] = ..., connect_url: _Optional[str] = ..., broker_url: _Optional[str] = ..., proxy: _Optional[bool] = ...) -> None: ...

class TopicPartitionsResponse(_message.Message):
    __slots__ = ("request_id", "partitions")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    partitions: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request_id: _Optional[int] = ..., partitions: _Optional[_Iterable[str]] = ...) -> None: ...

class HealthCheckRequest(_message.Message):
    __slots__ = ("request_id", "client", "id")
    class ClientType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        Producer: _ClassVar[HealthCheckRequest.ClientType]
        Consumer: _ClassVar[HealthCheckRequest.ClientType]
    Producer: HealthCheckRequest.ClientType
    Consumer: HealthCheckRequest.ClientType
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    client: HealthCheckRequest.ClientType
    id: int
    def __init__(self, request_id: _Optional[int] = ..., client: _Optional[_Union[HealthCheckRequest.ClientType, str]] = ..., id: _Optional[int] = ...) -> None: ...

class HealthCheckResponse(_message.Message):
    __slots__ = ("status",)
    class ClientStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        OK: _ClassVar[HealthCheckResponse.ClientStatus]
        CLOSE: _ClassVar[HealthCheckResponse.ClientStatus]
    OK: HealthCheckResponse.ClientStatus
    CLOSE: HealthCheckResponse.ClientStatus
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: HealthCheckResponse.ClientStatus
    def __init__(self, status: _Optional[_Union[HealthCheckResponse.ClientStatus, str]] = ...) -> None: ...

class ListSegmentDescriptorsRequest(_message.Message):
    __slots__ = ("topic", "after_offset")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    AFTER_OFFSET_FIELD_NUMBER: _ClassVar[int]
    topic: str
    after_offset: int
    def __init__(self, topic: _Optional[str] = ..., after_offset: _Optional[int] = ...) -> None: ...

class ListSegmentDescriptorsResponse(_message.Message):
    __slots__ = ("segments",)
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    segments: _containers.RepeatedCompositeFieldContainer[SegmentDescriptorProto]
    def __init__(self, segments: _Optional[_Iterable[_Union[SegmentDescriptorProto, _Mapping]]] = ...) -> None: ...

class SegmentDescriptorProto(_message.Message):
    __slots__ = ("segment_id", "start_offset", "end_offset", "size", "etag", "created_at")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    ETAG_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    segment_id: str
    start_offset: int
    end_offset: int
    size: int
    etag: str
    created_at: int
    def __init__(self, segment_id: _Optional[str] = ..., start_offset: _Optional[int] = ..., end_offset: _Optional[int] = ..., size: _Optional[int] = ..., etag: _Optional[str] = ..., created_at: _Optional[int] = ...) -> None: ...
