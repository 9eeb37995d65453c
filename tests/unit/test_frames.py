"""WAL frame codec (ister.core.frames)."""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c

from ister.core.frames import (
    HEADER_SIZE,
    MAX_FRAME_PAYLOAD,
    SparseIndex,
    decode_header,
    encode_frame,
    encode_frames,
    scan_frames,
)


def test_encode_frame_layout() -> None:
    frame = encode_frame(7, b"hello")
    assert len(frame) == HEADER_SIZE + 5
    assert struct.unpack_from("<QII", frame) == (7, 5, crc32c(b"hello"))
    assert frame[HEADER_SIZE:] == b"hello"
    assert decode_header(frame) == (7, 5, crc32c(b"hello"))


def test_encode_frames_refuses_an_oversize_payload_among_many() -> None:
    big = memoryview(bytearray(MAX_FRAME_PAYLOAD + 1))  # a view: no second copy of 64 MiB
    with pytest.raises(ValueError, match=f"payload of {MAX_FRAME_PAYLOAD + 1} bytes exceeds the frame limit"):
        encode_frames(0, [b"a", big, b"c"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="out of range"):
        encode_frames(-1, [b"a", b"b"])


def test_round_trip_many() -> None:
    payloads = [b"", b"a", b"bc" * 100, bytes(range(256))]
    buf = encode_frames(10, payloads)
    assert buf == b"".join(encode_frame(10 + i, p) for i, p in enumerate(payloads))
    res = scan_frames(buf, expect_offset=10)
    assert res.stop == "end"
    assert res.count == 4
    assert res.safe_length == len(buf) == res.end_pos
    assert res.next_offset == 14
    assert [(o, bytes(p)) for o, p, _ in res.frames] == [(10 + i, p) for i, p in enumerate(payloads)]
    positions = [pos for _, _, pos in res.frames]
    assert positions[0] == 0
    assert positions[1] == HEADER_SIZE
    assert positions[2] == 2 * HEADER_SIZE + 1


def test_single_payload_fast_path_matches() -> None:
    assert encode_frames(3, [b"xyz"]) == encode_frame(3, b"xyz")


def test_base_pos_is_added_to_positions() -> None:
    buf = encode_frames(0, [b"a", b"b"])
    res = scan_frames(buf, base_pos=1000)
    assert [pos for _, _, pos in res.frames] == [1000, 1000 + HEADER_SIZE + 1]
    assert res.end_pos == 1000 + len(buf)
    assert res.safe_length == len(buf)


def test_empty_buffer() -> None:
    res = scan_frames(b"", expect_offset=5)
    assert (res.stop, res.count, res.safe_length, res.next_offset) == ("end", 0, 0, 5)


@pytest.mark.parametrize("cut", [1, HEADER_SIZE - 1, HEADER_SIZE, HEADER_SIZE + 3])
def test_torn_tail(cut: int) -> None:
    good = encode_frames(0, [b"one", b"two"])
    tail = encode_frame(2, b"three!")
    buf = good + tail[:cut]
    res = scan_frames(buf, expect_offset=0)
    assert res.stop == "torn"
    assert res.count == 2
    assert res.safe_length == len(good)
    assert res.next_offset == 2
    assert res.needed == (HEADER_SIZE if cut < HEADER_SIZE else HEADER_SIZE + 6)


def test_crc_error_stops_scan() -> None:
    buf = bytearray(encode_frames(0, [b"aaaa", b"bbbb", b"cccc"]))
    second = HEADER_SIZE + 4
    buf[second + HEADER_SIZE + 1] ^= 0xFF  # flip a payload byte of frame 1
    res = scan_frames(bytes(buf), expect_offset=0)
    assert res.stop == "crc"
    assert res.count == 1
    assert res.safe_length == second


def test_crc_not_checked_when_disabled() -> None:
    buf = bytearray(encode_frames(0, [b"aaaa", b"bbbb"]))
    buf[HEADER_SIZE] ^= 0x01
    assert scan_frames(bytes(buf), verify_crc=False).stop == "end"


def test_gap_stops_scan() -> None:
    buf = encode_frames(0, [b"a", b"b"]) + encode_frame(3, b"d")
    res = scan_frames(buf, expect_offset=0)
    assert res.stop == "gap"
    assert res.count == 2
    assert res.next_offset == 2
    # without expect_offset the first frame may carry any offset, but the following ones must be dense
    assert scan_frames(buf[: 2 * (HEADER_SIZE + 1)], expect_offset=None).stop == "end"
    assert scan_frames(encode_frames(42, [b"a", b"b"])).next_offset == 44
    assert scan_frames(buf).stop == "gap"
    # a wrong first offset is a gap at position 0
    res = scan_frames(buf, expect_offset=1)
    assert (res.stop, res.count, res.safe_length) == ("gap", 0, 0)


def test_too_large_length() -> None:
    header = struct.pack("<QII", 1, MAX_FRAME_PAYLOAD + 1, 0)
    res = scan_frames(encode_frame(0, b"x") + header, expect_offset=0)
    assert res.stop == "too_large"
    assert res.count == 1


def test_zero_filled_tail_is_not_accepted_after_frames() -> None:
    buf = encode_frames(5, [b"a", b"b"]) + b"\x00" * 64
    res = scan_frames(buf, expect_offset=5)
    assert res.stop == "gap"
    assert res.next_offset == 7


def test_max_frames_limit() -> None:
    buf = encode_frames(0, [b"a"] * 5)
    res = scan_frames(buf, expect_offset=0, max_frames=2)
    assert (res.stop, res.count, res.next_offset) == ("limit", 2, 2)
    res = scan_frames(buf, expect_offset=0, max_frames=5)
    assert res.stop == "end"


def test_collect_false_counts_only() -> None:
    buf = encode_frames(0, [b"a"] * 5)
    res = scan_frames(buf, collect=False)
    assert res.count == 5
    assert res.frames == []


def test_scan_accepts_memoryview_slice() -> None:
    buf = b"junk" + encode_frames(4, [b"x", b"y"])
    res = scan_frames(memoryview(buf)[4:], base_pos=4, expect_offset=4)
    assert res.count == 2
    assert res.frames[0][2] == 4


def test_oversize_payload_rejected() -> None:
    with pytest.raises(ValueError):
        encode_frames(0, [b"a", b"x" * (MAX_FRAME_PAYLOAD + 1)])
    with pytest.raises(ValueError):
        encode_frame(-1, b"a")


def test_sparse_index_from_scan() -> None:
    payloads = [b"p" * 10] * 2500
    buf = encode_frames(100, payloads)
    index = SparseIndex(every_frames=1000, every_bytes=10**9)
    res = scan_frames(buf, expect_offset=100, collect=False, index=index)
    assert res.count == 2500
    assert [o for o, _ in index.entries] == [100, 1100, 2100]
    frame = HEADER_SIZE + 10
    assert index.entries[1] == (1100, 1000 * frame)
    assert index.floor(99) is None
    assert index.floor(100) == (100, 0)
    assert index.floor(2099) == (1100, 1000 * frame)
    assert index.floor(5000) == (2100, 2000 * frame)


def test_sparse_index_by_bytes() -> None:
    index = SparseIndex(every_frames=10**9, every_bytes=100)
    for i in range(10):
        index.note(i, i * 40)
    assert [p for _, p in index.entries] == [0, 120, 240, 360]
    with pytest.raises(ValueError):
        index.add(0, 0)
