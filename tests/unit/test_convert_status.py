"""Wire conversions (limits, optional-field presence) and the error -> gRPC status table.

`ister.wire` and the official `danube` client both register the `danube.*` protobuf symbols, so they cannot
share one process. The conversion tests import `ister.wire` only when they run (the `wire` fixture), and
when `danube` is already loaded (a whole-suite run that collected the integration tests) they are skipped
here and run instead by `test_wire_tests_in_child_process`, in a fresh interpreter.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from ister import errors
from ister.core.record import StoredMessage, decode_message, encode_message
from ister.limits import MAX_ATTRIBUTE_BYTES, MAX_ATTRIBUTES, MAX_NAME_LEN
from tests.unit.isolation import run_module_in_child

MAX_ROUTING_KEY = MAX_NAME_LEN * 4
_SHARED_WITH_DANUBE = "covered by test_wire_tests_in_child_process (danube's protos are loaded here)"


@pytest.fixture
def wire() -> SimpleNamespace:
    if "danube" in sys.modules:
        pytest.skip(_SHARED_WITH_DANUBE)
    from ister.wire import convert, status
    from ister.wire.gen import DanubeApi_pb2

    return SimpleNamespace(
        pb=DanubeApi_pb2,
        stored_from_wire=convert.stored_from_wire,
        wire_from_stored=convert.wire_from_stored,
        status_for=status.status_for,
    )


def test_wire_tests_in_child_process() -> None:
    run_module_in_child(__file__)


def _msg(w: SimpleNamespace, **kw: Any) -> Any:
    base: dict[str, Any] = {
        "request_id": 7,
        "msg_id": w.pb.MsgID(producer_id=999, topic_name="/default/t"),
        "payload": b"hello",
        "publish_time": 1_700_000_000_000,
        "producer_name": "spoofed-name",
    }
    base.update(kw)
    return w.pb.StreamMessage(**base)


# -- stored_from_wire ----------------------------------------------------------------------------------------


def test_identity_comes_from_the_session_not_the_message(wire: SimpleNamespace) -> None:
    stored = wire.stored_from_wire(_msg(wire), producer_id=42, producer_name="p1")
    assert stored.producer_id == 42
    assert stored.producer_name == "p1"
    assert stored.payload == b"hello"
    assert stored.publish_time == 1_700_000_000_000


def test_optional_fields_absent_stay_none(wire: SimpleNamespace) -> None:
    stored = wire.stored_from_wire(_msg(wire), 1, "p")
    assert stored.routing_key is None
    assert stored.schema_id is None
    assert stored.schema_version is None
    assert stored.attributes == {}
    assert stored.key == "p"  # Key-Shared falls back to the producer name


def test_optional_fields_present_even_when_zero_or_empty(wire: SimpleNamespace) -> None:
    stored = wire.stored_from_wire(_msg(wire, routing_key="", schema_id=0, schema_version=0), 1, "p")
    assert stored.routing_key == ""
    assert stored.schema_id == 0
    assert stored.schema_version == 0
    assert stored.key == ""


def test_routing_key_and_schema_kept(wire: SimpleNamespace) -> None:
    stored = wire.stored_from_wire(_msg(wire, routing_key="eu-1", schema_id=5, schema_version=3), 1, "p")
    assert (stored.routing_key, stored.schema_id, stored.schema_version) == ("eu-1", 5, 3)
    assert stored.key == "eu-1"


def test_attribute_count_limit(wire: SimpleNamespace) -> None:
    attrs = {f"k{i}": "v" for i in range(MAX_ATTRIBUTES)}
    assert len(wire.stored_from_wire(_msg(wire, attributes=attrs), 1, "p").attributes) == MAX_ATTRIBUTES
    attrs["one-more"] = "v"
    with pytest.raises(errors.InvalidArgument, match="too many attributes"):
        wire.stored_from_wire(_msg(wire, attributes=attrs), 1, "p")


def test_attribute_size_limit(wire: SimpleNamespace) -> None:
    exact = {"k": "v" * (MAX_ATTRIBUTE_BYTES - 1)}
    assert wire.stored_from_wire(_msg(wire, attributes=exact), 1, "p").attributes == exact
    over = {"k": "v" * MAX_ATTRIBUTE_BYTES}
    with pytest.raises(errors.InvalidArgument, match="attributes exceed"):
        wire.stored_from_wire(_msg(wire, attributes=over), 1, "p")
    spread = {f"k{i:03d}": "v" * (MAX_ATTRIBUTE_BYTES // 200) for i in range(250)}
    with pytest.raises(errors.InvalidArgument, match="attributes exceed"):
        wire.stored_from_wire(_msg(wire, attributes=spread), 1, "p")


def test_attribute_size_limit_counts_bytes(wire: SimpleNamespace) -> None:
    wide = {"k": "\U0001f600" * (MAX_ATTRIBUTE_BYTES // 2)}  # 2x the limit in UTF-8 bytes
    with pytest.raises(errors.InvalidArgument):
        wire.stored_from_wire(_msg(wire, attributes=wide), 1, "p")


def test_routing_key_length_limit(wire: SimpleNamespace) -> None:
    ok = "k" * MAX_ROUTING_KEY
    assert wire.stored_from_wire(_msg(wire, routing_key=ok), 1, "p").routing_key == ok
    with pytest.raises(errors.InvalidArgument, match="routing_key"):
        wire.stored_from_wire(_msg(wire, routing_key=ok + "k"), 1, "p")


def test_stored_record_survives_the_wal_codec(wire: SimpleNamespace) -> None:
    stored = wire.stored_from_wire(
        _msg(wire, attributes={"a": "1", "\u00e9": "\U0001f600"}, routing_key="r", schema_id=2), 1, "p"
    )
    assert decode_message(encode_message(stored)) == stored


# -- wire_from_stored ----------------------------------------------------------------------------------------


def test_wire_from_stored_carries_identity(wire: SimpleNamespace) -> None:
    stored = StoredMessage(
        payload=b"x",
        publish_time=123,
        producer_id=42,
        producer_name="p1",
        attributes={"a": "b"},
        routing_key="rk",
        schema_id=9,
        schema_version=1,
    )
    out = wire.wire_from_stored(
        stored, offset=17, topic="/default/t", subscription="s", broker_addr="http://127.0.0.1:6650"
    )
    assert out.request_id == 17
    assert out.msg_id.topic_offset == 17
    assert out.msg_id.producer_id == 42
    assert out.msg_id.topic_name == "/default/t"
    assert out.msg_id.broker_addr == "http://127.0.0.1:6650"
    assert out.payload == b"x"
    assert out.publish_time == 123
    assert out.producer_name == "p1"
    assert out.subscription_name == "s"
    assert dict(out.attributes) == {"a": "b"}
    assert out.routing_key == "rk"
    assert (out.schema_id, out.schema_version) == (9, 1)
    # Survives serialization (what the client really gets).
    assert wire.pb.StreamMessage.FromString(out.SerializeToString()) == out


def test_wire_from_stored_leaves_absent_fields_unset(wire: SimpleNamespace) -> None:
    stored = StoredMessage(payload=b"", publish_time=0, producer_id=1, producer_name="p")
    out = wire.wire_from_stored(stored, offset=0, topic="/default/t", subscription="s", broker_addr="a")
    assert not out.HasField("routing_key")
    assert not out.HasField("schema_id")
    assert not out.HasField("schema_version")
    present = wire.wire_from_stored(
        StoredMessage(b"", 0, 1, "p", {}, "", 0, 0), offset=0, topic="/t/t", subscription="s", broker_addr="a"
    )
    assert present.HasField("routing_key") and present.routing_key == ""
    assert present.HasField("schema_id") and present.HasField("schema_version")


def test_roundtrip_wire_stored_wire(wire: SimpleNamespace) -> None:
    incoming = _msg(wire, attributes={"x": "y"}, routing_key="k", schema_version=4)
    stored = wire.stored_from_wire(incoming, 5, "prod")
    out = wire.wire_from_stored(stored, offset=3, topic="/default/t", subscription="s", broker_addr="b")
    assert out.payload == incoming.payload
    assert dict(out.attributes) == dict(incoming.attributes)
    assert out.routing_key == "k"
    assert not out.HasField("schema_id")
    assert out.schema_version == 4
    assert out.msg_id.producer_id == 5
    assert out.producer_name == "prod"


# -- errors -> status ----------------------------------------------------------------------------------------

C = grpc.StatusCode


@pytest.mark.parametrize(
    ("exc", "code", "retriable"),
    [
        (errors.InvalidArgument("x"), C.INVALID_ARGUMENT, False),
        (errors.ConfigError("x"), C.INVALID_ARGUMENT, False),
        (errors.NotFound("x"), C.NOT_FOUND, False),
        (errors.AlreadyExists("x"), C.ALREADY_EXISTS, False),
        (errors.FailedPrecondition("x"), C.FAILED_PRECONDITION, False),
        (errors.PermissionDenied("x"), C.PERMISSION_DENIED, False),
        (errors.Unavailable("x"), C.UNAVAILABLE, True),
        (errors.ResourceExhausted("x"), C.RESOURCE_EXHAUSTED, True),
        (errors.Timeout("x"), C.DEADLINE_EXCEEDED, True),
        (errors.OffsetOutOfRange("x"), C.OUT_OF_RANGE, False),
        (errors.MetadataError("x"), C.UNAVAILABLE, True),
        (errors.WatchLagged("x"), C.UNAVAILABLE, True),
        (errors.StorageError("x"), C.INTERNAL, False),
        (errors.CorruptionError("x"), C.INTERNAL, False),
        (errors.IsterError("x"), C.INTERNAL, False),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else str(v),
)
def test_status_table(
    wire: SimpleNamespace, exc: errors.IsterError, code: grpc.StatusCode, retriable: bool
) -> None:
    assert wire.status_for(exc) == code
    assert exc.retriable is retriable


def test_client_visible_rules(wire: SimpleNamespace) -> None:
    """DESIGN §4: bad input/oversize must never look retriable to the official client."""
    assert wire.status_for(errors.InvalidArgument("oversize")) != C.RESOURCE_EXHAUSTED
    # Every retriable error maps to a code the client retries; no non-retriable one does.
    retried = {C.UNAVAILABLE, C.RESOURCE_EXHAUSTED, C.DEADLINE_EXCEEDED}

    def leaves(cls: type[errors.IsterError]) -> list[type[errors.IsterError]]:
        subs = cls.__subclasses__()
        return [cls] + [c for s in subs for c in leaves(s)]

    # The one exception, by the word: a backlog quota refusal is RESOURCE_EXHAUSTED (Pulsar's and
    # Kafka's clients see their own quota errors too); the official client retries it until the quota
    # clears, the Ister client reports it at once (the status's `ister-retriable: false` trailer).
    for cls in leaves(errors.IsterError):
        if cls is errors.QuotaExceeded:
            assert wire.status_for(cls("x")) == C.RESOURCE_EXHAUSTED and not cls.retriable
            continue
        assert (wire.status_for(cls("x")) in retried) == cls.retriable, cls.__name__
