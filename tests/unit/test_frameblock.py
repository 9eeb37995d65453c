"""FrameBlock / check_dense (ister.core.frameblock) and HeldRecords (ister.broker.held): frames kept as read,
checked once, handed to consumers as slices."""

from __future__ import annotations

from itertools import pairwise

import pytest

from ister.broker.held import COMPACT_MIN_BLOCKS, HeldRecords
from ister.broker.sessions import CHUNK_MAX_BYTES, CHUNK_MAX_MESSAGES, ConsumerStream, Outbound, OutChunk
from ister.core.frameblock import FrameBlock, check_dense
from ister.core.frames import HEADER_SIZE, encode_frames, split_dense


def payloads(first: int, n: int, size: int = 10) -> list[bytes]:
    return [f"{i:0{size}d}".encode() for i in range(first, first + n)]


def block(first: int, n: int, size: int = 10) -> FrameBlock:
    buf = encode_frames(first, payloads(first, n, size))
    starts, used, needed, problem = check_dense(buf, first, n)
    assert problem is None and used == len(buf) and needed == 0
    return FrameBlock(first, buf, starts)


def test_check_dense_agrees_with_split_dense_and_stops_where_it_does() -> None:
    buf = encode_frames(5, payloads(5, 20))
    starts, used, needed, problem = check_dense(buf, 5, 100)
    got, used2, needed2, problem2 = split_dense(buf, 5, 100)
    assert (used, needed, problem) == (used2, needed2, problem2) == (len(buf), 0, None)
    assert [buf[s + HEADER_SIZE : e] for s, e in pairwise(starts)] == got
    assert check_dense(buf, 5, 3)[:2] == ([0, 26, 52, 78], 78)  # max_frames
    torn = check_dense(buf[:-3], 5, 100)
    assert (len(torn[0]) - 1, torn[2], torn[3]) == (19, 26, None)  # 3 bytes short of the last frame
    damaged = bytearray(buf)
    damaged[3 * 26 + HEADER_SIZE] ^= 1  # payload of offset 8
    starts, used, _, problem = check_dense(bytes(damaged), 5, 100)
    assert (len(starts) - 1, used, problem) == (3, 78, "crc")
    assert check_dense(buf, 6, 100)[3] == "gap"


def test_block_slices_share_the_buffer_and_give_records() -> None:
    b = block(100, 10)
    assert (b.first, b.count, b.end, b.nbytes) == (100, 10, 110, 260)
    part = b.slice(103, 107)
    assert part.buf is b.buf and (part.first, part.count) == (103, 4)
    assert bytes(part.frames()) == encode_frames(103, payloads(103, 4))
    assert part.record(105) == b"0000000105" and part.records()[0] == (103, b"0000000103")
    assert [bytes(p) for p in part.payloads()] == payloads(103, 4)
    assert b.slice(100, 110) is b
    assert b.prefix(4, 10_000) == 4 and b.prefix(100, 60) == 2 and b.prefix(100, 1) == 1
    with pytest.raises(ValueError):
        b.slice(109, 111)
    with pytest.raises(KeyError):
        b.record(110)


def test_chunks_of_a_run_are_slices_of_the_blocks_within_the_frame_limits() -> None:
    held = HeldRecords()
    big = block(0, CHUNK_MAX_MESSAGES + 100)
    held.add_block(big)
    held.add_block(block(big.end, 50))
    chunks = held.chunks(range(10, big.end + 20), False)
    assert chunks is not None
    assert [(c.offsets[0], c.count) for c in chunks] == [(10, CHUNK_MAX_MESSAGES), (4106, 90), (4196, 20)]
    assert all(c.block is not None and c.block.buf in (big.buf, held._blocks[1].buf) for c in chunks)
    assert b"".join(bytes(c.block.frames()) for c in chunks if c.block) == encode_frames(
        10, payloads(10, big.end + 10)
    )
    # Large frames: the byte limit cuts a chunk (one frame may exceed it alone).
    held = HeldRecords()
    held.add_block(block(0, 5, size=CHUNK_MAX_BYTES // 2))
    sizes = [c.count for c in held.chunks(range(0, 5), False) or []]
    assert sizes == [1, 1, 1, 1, 1]


def test_records_redeliveries_and_missing_offsets() -> None:
    held = HeldRecords()
    held.add_block(block(0, 10))
    held.add_records([(10, b"ten"), (11, b"eleven")])
    mixed = held.chunks(range(8, 12), False)
    assert mixed is not None and [c.block is not None for c in mixed] == [True, False]
    assert mixed[1].records == [b"ten", b"eleven"] and list(mixed[1].offsets) == [10, 11]
    again = held.chunks([3, 7, 11], True)  # a redelivery: records, framed when sent
    assert (
        again is not None
        and again[0].redelivery
        and again[0].records
        == [
            b"0000000003",
            b"0000000007",
            b"eleven",
        ]
    )
    assert held.chunks(range(9, 13), False) is None  # 12 is not held
    assert held.get(4) == b"0000000004" and held.get(12) is None


def test_prune_drops_blocks_behind_the_cursor_and_compacts_sparse_ones() -> None:
    held = HeldRecords()
    for i in range(3):
        held.add_block(block(i * 10, 10))
    held.add_records([(30, b"x")])
    held.prune([30], 20, set())
    assert held.blocks == 1 and held.records == {}
    # The cursor is held back at offset 20: blocks pile up until compaction copies out what is held.
    for i in range(3, 3 + COMPACT_MIN_BLOCKS + 1):
        held.add_block(block(i * 10, 10))
    still = {20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 35, 660}  # block 20 dense, 35 and 660 sparse
    held.prune([], 20, still)
    assert held.blocks == 1 and held._blocks[0].first == 20
    assert held.records == {35: b"0000000035", 660: b"0000000660"}
    assert held.get(25) == b"0000000025" and held.get(36) is None


async def test_stream_bounds_messages_and_hands_out_chunks_then_the_end() -> None:
    stream = ConsumerStream(10)
    b = block(0, 8)
    assert stream.offer_chunk(OutChunk(range(0, 8), block=b))
    assert not stream.offer_chunk(OutChunk(range(8, 11), records=[b"a", b"b", b"c"]))  # 11 > 10
    assert stream.offer(Outbound(8, b"r"))
    assert stream.pending == 9
    got = await stream.get()
    assert isinstance(got, OutChunk) and [o.record for o in got.outbounds()] == payloads(0, 8)
    assert stream.pending == 1 and isinstance(stream.peek(), Outbound)
    stream.end()
    assert await stream.get() is None and not stream.offer(Outbound(9, b"s"))
