"""The one validation of a published record (`ister.core.record`), the wire's enum checks, and the echo
helpers that keep error messages short."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from ister import errors
from ister.core.dispatch import SubType
from ister.core.record import (
    StoredMessage,
    check_attributes,
    check_routing_key,
    decode_published,
    decode_published_lean,
    repair_for_wire,
)
from ister.ids import TopicName, clip, shown, validate_client_name
from ister.limits import MAX_ATTRIBUTES, MAX_ECHO_CHARS, MAX_ROUTING_KEY_CHARS, U32_MAX, U64_MAX
from ister.wire.enums import access_mode_from_wire, reliable_from_wire, sub_type_from_wire

GOOD: list[Any] = [b"payload", 1_700_000_000_000, 7, "p", {"a": "b"}, "key", 3, 4]


def _records(*recs: Any) -> bytes:
    return msgspec.msgpack.encode(list(recs))


def _both(data: bytes) -> None:
    """Both decoders (non-reliable and reliable topics) accept, or both refuse with InvalidArgument."""
    outcomes = []
    for decode in (decode_published, decode_published_lean):
        try:
            records, _ = decode(data)
            for r in records:
                check_attributes(r.attributes)
                check_routing_key(r.routing_key)
            outcomes.append(None)
        except errors.InvalidArgument as exc:
            outcomes.append(str(exc))
    assert (outcomes[0] is None) == (outcomes[1] is None), outcomes
    if outcomes[0] is not None:
        raise errors.InvalidArgument(outcomes[0])


def _with(index: int, value: Any) -> list[Any]:
    rec = list(GOOD)
    rec[index] = value
    return rec


def test_edges_of_every_range_are_accepted() -> None:
    edge = [b"", U64_MAX, U64_MAX, "p", {}, "k" * MAX_ROUTING_KEY_CHARS, U64_MAX, U32_MAX]
    records, raws = decode_published(_records(edge, GOOD, GOOD[:4]))
    assert [r.publish_time for r in records] == [U64_MAX, GOOD[1], GOOD[1]]
    assert records[2].attributes == {} and records[2].schema_id is None
    assert isinstance(records[0], StoredMessage)
    assert msgspec.msgpack.decode(raws[0]) == edge  # stored as it came


@pytest.mark.parametrize(
    ("index", "value"),
    [
        (1, -1),  # publish_time
        (1, -(2**63)),
        (1, 1.5),
        (2, -1),  # producer_id
        (5, "k" * (MAX_ROUTING_KEY_CHARS + 1)),  # routing_key
        (5, 5),
        (6, -1),  # schema_id
        (7, -1),  # schema_version
        (7, U32_MAX + 1),
        (0, "payload as str"),
        (4, {"k": 1}),  # attributes
        (4, {1: "v"}),
    ],
)
def test_a_field_outside_the_wire_range_is_refused(index: int, value: Any) -> None:
    with pytest.raises(errors.InvalidArgument, match="malformed"):
        _both(_records(GOOD, _with(index, value)))


def test_extra_fields_and_short_records_are_refused() -> None:
    with pytest.raises(errors.InvalidArgument, match="at most length 8"):
        _both(_records([*GOOD, "extra"]))
    with pytest.raises(errors.InvalidArgument, match="malformed"):
        _both(_records(GOOD[:3]))


def test_deep_nesting_and_bad_utf8_are_invalid_argument() -> None:
    deep = msgspec.Raw(b"\x91" * 100_000 + b"\xc0")
    for index in (0, 4, 5):
        with pytest.raises(errors.InvalidArgument, match="malformed"):
            _both(_records(_with(index, deep)))
    name = msgspec.msgpack.encode("p")
    data = _records(GOOD).replace(name, b"\xa1\xff", 1)
    with pytest.raises(errors.InvalidArgument, match="malformed"):
        _both(data)


def test_attribute_limits() -> None:
    many = {f"k{i}": "v" for i in range(MAX_ATTRIBUTES + 1)}
    with pytest.raises(errors.InvalidArgument):
        _both(_records(_with(4, many)))
    utf8 = {"k": "é" * 32_768}  # 65,537 bytes of UTF-8, 32,769 characters
    with pytest.raises(errors.InvalidArgument, match="attributes exceed 65536 bytes"):
        _both(_records(_with(4, utf8)))
    _both(_records(_with(4, {"k": "é" * 32_767})))
    with pytest.raises(errors.InvalidArgument, match="strings"):
        check_attributes({"k": 1})  # type: ignore[dict-item]  # the Ister client's users may pass anything


def test_repair_for_wire_clears_only_what_is_out_of_range() -> None:
    good = StoredMessage(b"x", 5, 6, "p", {"a": "b"}, "k", 7, 8)
    assert repair_for_wire(good) is good
    bad = StoredMessage(b"x", -5, -6, "p", {"a": "b"}, "k", -7, U32_MAX + 1)
    fixed = repair_for_wire(bad)
    assert (fixed.publish_time, fixed.producer_id, fixed.schema_id, fixed.schema_version) == (
        0,
        0,
        None,
        None,
    )
    assert (fixed.payload, fixed.attributes, fixed.routing_key) == (b"x", {"a": "b"}, "k")


def test_unknown_enum_values_are_refused() -> None:
    assert reliable_from_wire(1, "delivery") is True
    assert reliable_from_wire(0, "delivery") is False
    assert access_mode_from_wire(1) == 1
    assert sub_type_from_wire(3) is SubType.KEY_SHARED
    for bad in (2, -1, 99):
        with pytest.raises(errors.InvalidArgument, match=f"unknown delivery {bad}"):
            reliable_from_wire(bad, "delivery")
        with pytest.raises(errors.InvalidArgument, match="producer_access_mode"):
            access_mode_from_wire(bad)
    with pytest.raises(errors.InvalidArgument, match="subscription type 4"):
        sub_type_from_wire(4)


def test_echoed_input_is_cut() -> None:
    assert shown("short") == "'short'"
    long = "x" * 10_000
    text = shown(long)
    assert len(text) < MAX_ECHO_CHARS + 40 and text.endswith("(10000 characters)")
    assert shown(b"\x00" * 5000).endswith("(5000 bytes)")
    assert len(clip("y" * 5000)) < MAX_ECHO_CHARS + 40
    for bad in ("/default/" + long, "/" + long + "/t", long):
        with pytest.raises(errors.InvalidArgument) as info:
            TopicName.parse(bad)
        assert len(str(info.value)) < 400
    with pytest.raises(errors.InvalidArgument) as info:
        validate_client_name("a/" + long, "consumer name")
    assert len(str(info.value)) < 400


def test_status_messages_are_capped_in_utf8_bytes() -> None:
    from ister.limits import MAX_STATUS_MESSAGE_BYTES
    from ister.server.errors import status_message

    assert status_message("short") == "short"
    for text in ("a" * 5000, "é" * 5000, "😀" * 5000):
        cut = status_message(text)
        assert len(cut.encode()) <= MAX_STATUS_MESSAGE_BYTES and cut.endswith("...")
        assert text.startswith(cut[:-3])
