"""Publish times read from stored records, the `--time` parser, and the publish-time range of object
descriptors (written by the segment builder, kept optional in the descriptor JSON)."""

from __future__ import annotations

import msgspec
import pytest

from ister.core.frames import encode_frame
from ister.core.publish_time import first_unit, frames_time_span, publish_time_of
from ister.core.record import StoredMessage, encode_message
from ister.core.timespec import format_time, parse_time
from ister.errors import InvalidArgument
from ister.storage.objects.catalog import ObjectDescriptor
from ister.storage.objects.segment import SegmentBuilder

NOW = 1_780_000_000_000


@pytest.mark.parametrize("payload_len", [0, 1, 255, 256, 65_535, 65_536])
@pytest.mark.parametrize("t", [0, 127, 128, 255, 256, 65_535, 65_536, 2**32 - 1, 2**32, NOW])
def test_publish_time_of_every_msgpack_width(payload_len: int, t: int) -> None:
    record = encode_message(StoredMessage(b"x" * payload_len, t, 7, "p", {"a": "b"}, "k", 1, 2))
    assert publish_time_of(record) == t
    assert publish_time_of(memoryview(record)) == t
    assert publish_time_of(msgspec.Raw(record)) == t


def test_publish_time_of_a_malformed_record_is_none() -> None:
    assert publish_time_of(b"") is None
    assert publish_time_of(b"\x92\xc4") is None  # torn
    assert publish_time_of(b"\xa3abc") is None  # not an array
    assert publish_time_of(msgspec.msgpack.encode([b"x", -5])) is None


def test_frames_time_span_and_first_unit() -> None:
    times = [NOW + 5, NOW, NOW + 9, NOW + 1]
    buf = b"".join(
        encode_frame(i, encode_message(StoredMessage(b"p", t, 1, "p"))) for i, t in enumerate(times)
    )
    assert frames_time_span(buf) == (NOW, NOW + 9)
    assert frames_time_span(b"") is None
    assert first_unit([NOW, NOW + 10, None], NOW + 5) == 1
    assert first_unit([NOW, None, NOW + 10], NOW + 5) == 1  # an unknown range is searched, not skipped
    assert first_unit([NOW, NOW + 1], NOW + 5) == 2


def test_the_segment_builder_keeps_the_publish_time_range() -> None:
    builder = SegmentBuilder(10)
    frames = b"".join(
        encode_frame(10 + i, encode_message(StoredMessage(b"p", NOW + 100 - i, 1, "p"))) for i in range(50)
    )
    builder.feed(frames[:37])  # a torn frame carried to the next feed
    builder.feed(frames[37:])
    builder.finish()
    assert builder.time_span == (NOW + 51, NOW + 100)


def _descriptor(**extra: object) -> dict[str, object]:
    return {
        "object_id": "data-0-9.dnb1",
        "key": "ns/t/data-0-9.dnb1",
        "start_offset": 0,
        "end_offset": 9,
        "size": 100,
        "etag": None,
        "created_at": 1,
        "completed": True,
        **extra,
    }


def test_descriptor_publish_times_are_optional_and_round_trip() -> None:
    old = ObjectDescriptor.from_json(_descriptor())
    assert old is not None and old.min_publish_time_ms is None and old.max_publish_time_ms is None
    assert "min_publish_time_ms" not in old.to_json()
    new = ObjectDescriptor.from_json(_descriptor(min_publish_time_ms=NOW, max_publish_time_ms=NOW + 9))
    assert new is not None and (new.min_publish_time_ms, new.max_publish_time_ms) == (NOW, NOW + 9)
    assert new.to_json()["max_publish_time_ms"] == NOW + 9
    assert ObjectDescriptor.from_json(new.to_json()) == new
    bad_pairs: list[dict[str, object]] = [
        {"min_publish_time_ms": NOW},
        {"min_publish_time_ms": 5, "max_publish_time_ms": 4},
        {"min_publish_time_ms": True, "max_publish_time_ms": 4},
        {"min_publish_time_ms": "1", "max_publish_time_ms": 4},
    ]
    for bad in bad_pairs:
        parsed = ObjectDescriptor.from_json(_descriptor(**bad))  # a bad hint never hides the object
        assert parsed is not None and parsed.max_publish_time_ms is None
    with pytest.raises(InvalidArgument):
        ObjectDescriptor("data-0-9.dnb1", "k/data-0-9.dnb1", 0, 9, 1, None, 1, True, (), 5, None)


def test_parse_time() -> None:
    assert parse_time("2026-12-01T10:00:00Z", NOW) == 1_796_119_200_000
    assert parse_time("2026-12-01T11:00:00+01:00", NOW) == 1_796_119_200_000
    assert parse_time("2026-12-01T10:00:00", NOW) == 1_796_119_200_000  # no zone: UTC
    assert parse_time("-30m", NOW) == NOW - 1_800_000
    assert parse_time("-2h", NOW) == NOW - 7_200_000
    assert parse_time("-7d", NOW) == NOW - 7 * 86_400_000
    assert parse_time("-500ms", NOW) == NOW - 500
    assert parse_time("1700000000000", NOW) == 1_700_000_000_000
    for bad in ("", "yesterday", "-30", "+30m", "-30y", "99999999999999999", "2026-13-01"):
        with pytest.raises(InvalidArgument):
            parse_time(bad, NOW)
    with pytest.raises(InvalidArgument, match="1970"):
        parse_time("-100w", 1000)
    assert format_time(1_796_119_200_123) == "2026-12-01T10:00:00.123Z"
