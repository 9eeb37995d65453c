"""Pure pieces of the client: key routing, status mapping, MessageBatch decoding, ack ranges, retry policy."""

from __future__ import annotations

from types import SimpleNamespace

import grpc
import msgspec
import pytest

from ister import errors
from ister.client import _conn
from ister.client._conn import RetryBudget, RetryPolicy, normalize_url
from ister.client.errors import ConnectionLost, exhausted, from_status, to_ister_error
from ister.client.messages import decode_batch, offset_ranges
from ister.client.records import encode_records
from ister.client.routing import Router, fnv1a_64
from ister.core.frames import encode_frame, encode_frames
from ister.core.record import StoredMessage, encode_message


# Reference values computed with the official danube-client 0.5.0 (`danube.message_router._fnv1a_hash`).
# They are inlined because importing `danube` here would clash with the Danube protobuf modules other unit
# tests load into the same process.
@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("", 0xCBF29CE484222325),
        ("a", 0xAF63DC4C8601EC8C),
        ("order-42", 0x7D1DEB86A05662D4),
        ("ключ", 0x296130DE6F5B7A81),
        ("🔑 emoji", 0x2ECDAE29D5AFB23D),
        ("x" * 300, 0xE78DDF9F1BA85555),
    ],
)
def test_fnv1a_matches_danube_client(key: str, expected: int) -> None:
    assert fnv1a_64(key) == expected


def test_router_round_robin_advances_on_seal_of_current() -> None:
    r = Router(3)
    assert r.current == 0
    r.advance(1)  # another partition's batch: no move
    assert r.current == 0
    r.advance(0)
    r.advance(1)
    assert r.current == 2
    r.advance(2)
    assert r.current == 0
    assert Router(3).for_key("k") == fnv1a_64("k") % 3
    assert Router(1).for_key("anything") == 0


@pytest.mark.parametrize(
    ("code", "cls", "retriable"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, errors.InvalidArgument, False),
        (grpc.StatusCode.NOT_FOUND, errors.NotFound, False),
        (grpc.StatusCode.FAILED_PRECONDITION, errors.FailedPrecondition, False),
        (grpc.StatusCode.ALREADY_EXISTS, errors.AlreadyExists, False),
        (grpc.StatusCode.PERMISSION_DENIED, errors.PermissionDenied, False),
        (grpc.StatusCode.UNAVAILABLE, errors.Unavailable, True),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, errors.ResourceExhausted, True),
        (grpc.StatusCode.DEADLINE_EXCEEDED, errors.Timeout, True),
        (grpc.StatusCode.OUT_OF_RANGE, errors.OffsetOutOfRange, False),
        (grpc.StatusCode.INTERNAL, errors.StorageError, False),
        (grpc.StatusCode.UNKNOWN, errors.Unavailable, True),
        (grpc.StatusCode.CANCELLED, errors.Unavailable, True),
    ],
)
def test_status_mapping(code: grpc.StatusCode, cls: type, retriable: bool) -> None:
    err = from_status(code, "the server's message")
    assert type(err) is cls
    assert err.retriable is retriable
    assert str(err) == "the server's message"


def test_masked_status_is_a_lost_connection() -> None:
    err = from_status(grpc.StatusCode.INTERNAL, "Internal error from Core")
    assert isinstance(err, ConnectionLost) and err.retriable


def test_other_exceptions() -> None:
    assert isinstance(to_ister_error(TimeoutError()), errors.Timeout)
    assert isinstance(to_ister_error(RuntimeError("x")), errors.Unavailable)
    e = errors.NotFound("n")
    assert to_ister_error(e) is e


def _record(payload: bytes) -> bytes:
    return encode_message(StoredMessage(payload, 1, 7, "p", {"a": "b"}, "k"))


class _Sub:
    topic = "/default/t"
    epoch = 0  # the cursor epoch of the stream (ConsumeOpened.cursor_epoch)


def test_decode_batch_contiguous_and_gaps() -> None:
    sub = _Sub()
    frames = encode_frames(5, [_record(b"x"), _record(b"y")]) + encode_frame(9, _record(b"z"))
    frames += encode_frame(2, _record(b"old"))  # a redelivery of an earlier offset
    msgs, max_seen = decode_batch(frames, 4, sub, -1)  # type: ignore[arg-type]
    assert [(m.offset, m.payload, m.redelivered) for m in msgs] == [
        (5, b"x", False),
        (6, b"y", False),
        (9, b"z", False),
        (2, b"old", True),
    ]
    assert max_seen == 9
    assert msgs[0].attributes == {"a": "b"} and msgs[0].key == "k" and msgs[0].topic == "/default/t"
    again, _ = decode_batch(encode_frame(6, _record(b"y")), 1, sub, max_seen)  # type: ignore[arg-type]
    assert again[0].redelivered


def test_decode_batch_rejects_corruption() -> None:
    sub = _Sub()
    good = encode_frame(0, _record(b"abc"))
    bad_crc = good[:-1] + bytes([good[-1] ^ 0xFF])
    with pytest.raises(errors.CorruptionError):
        decode_batch(bad_crc, 1, sub, -1)  # type: ignore[arg-type]
    with pytest.raises(errors.CorruptionError):
        decode_batch(good[:-2], 1, sub, -1)  # type: ignore[arg-type]
    with pytest.raises(errors.CorruptionError):
        decode_batch(good, 2, sub, -1)  # type: ignore[arg-type]
    with pytest.raises(errors.CorruptionError):
        decode_batch(encode_frame(0, b"\xc1garbage"), 1, sub, -1)  # type: ignore[arg-type]


def test_offset_ranges() -> None:
    assert offset_ranges([]) == []
    assert offset_ranges([3, 1, 2, 2, 7, 9, 8, 11]) == [(1, 3), (7, 9), (11, 11)]
    assert offset_ranges(list(range(1000))) == [(0, 999)]


def test_retry_policy_and_urls() -> None:
    p = RetryPolicy(5, 0.2, 1.0)
    assert 0.1 <= p.delay(1) <= 0.2
    assert 0.5 <= p.delay(10) <= 1.0
    assert normalize_url("127.0.0.1:6650") == "http://127.0.0.1:6650"
    assert normalize_url("http://h:1/") == "http://h:1"


def test_retry_budget_ends_after_its_time_or_its_count(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(_conn, "time", SimpleNamespace(monotonic=lambda: now[0]))  # a fake clock
    budget = RetryBudget(RetryPolicy(None, 0.2, 2.0, timeout=10.0))
    delays = []
    while (d := budget.next_delay()) is not None:
        delays.append(d)
        now[0] += d + 0.5  # the delay, then an attempt that fails after 0.5 s
    assert 10.0 <= now[0] - 100.0 <= 10.0 + 2.5 and len(delays) == budget.attempts - 1
    assert all(d <= 2.0 for d in delays)
    err = exhausted(errors.Unavailable("refused"), budget, "/default/t: publishing")
    assert isinstance(err, errors.Unavailable) and err.retriable
    assert str(err).startswith(f"/default/t: publishing: gave up after {budget.attempts} attempts")
    assert str(err).endswith(": refused")
    assert isinstance(exhausted(errors.Timeout("slow"), budget, "x"), errors.Timeout)
    budget.reset()  # progress: a fresh series
    assert budget.next_delay() is not None and budget.attempts == 1

    capped = RetryBudget(RetryPolicy(2, 0.2, 2.0, timeout=1000.0))
    assert [capped.next_delay() is not None for _ in range(3)] == [True, True, False]
    assert RetryBudget(RetryPolicy(None, timeout=0.0)).next_delay() is None


@pytest.mark.parametrize("size", [0, 1, 255, 256, 65535, 65536, 70000])
def test_encode_records_matches_stored_message_layout(size: int) -> None:
    payload = bytes(range(256)) * (size // 256) + b"z" * (size % 256)
    segments = [
        [[payload, b"second"], 1700000000123, {}, None],
        [[bytearray(b"ba"), memoryview(b"mv")], 1700000000124, {"a": "b", "ü": "ß"}, "key-1"],
    ]
    encoded = encode_records(segments, 4, 2**64 - 1, "prödücer")
    decoded = msgspec.msgpack.decode(encoded, type=list[StoredMessage])
    assert decoded == [
        StoredMessage(payload, 1700000000123, 2**64 - 1, "prödücer", {}, None),
        StoredMessage(b"second", 1700000000123, 2**64 - 1, "prödücer", {}, None),
        StoredMessage(b"ba", 1700000000124, 2**64 - 1, "prödücer", {"a": "b", "ü": "ß"}, "key-1"),
        StoredMessage(b"mv", 1700000000124, 2**64 - 1, "prödücer", {"a": "b", "ü": "ß"}, "key-1"),
    ]


def test_encode_records_array_headers() -> None:
    for n in (0, 1, 15, 16, 65535, 65536):
        decoded = msgspec.msgpack.decode(encode_records([[[b"x"] * n, 1, {}, None]], n, 3, "p"))
        assert len(decoded) == n


async def test_seed_urls_skip_a_dead_broker() -> None:
    from ister.client import Client
    from ister.errors import InvalidArgument, Unavailable
    from tests.support import free_port
    from tests.unit.test_client_support import FakeServer

    server = FakeServer()
    await server.start()
    dead = f"http://127.0.0.1:{free_port()}"
    try:
        with pytest.raises(InvalidArgument):
            Client(" , ")
        client = Client(f"{dead}, {server.url}", connect_timeout=2.0)
        assert client.urls == [dead, server.url]
        async with client:  # connect() moves past the dead seed
            assert client.url == server.url
            producer = await client.producer("/default/seeds")
            assert await producer.send(b"x") == 0
        # A lookup that finds its seed dead moves on, so the retry reaches a live broker.
        other = Client([server.url, dead], connect_timeout=2.0)
        await server.stop()
        with pytest.raises(Unavailable):
            await other.lookup("/default/seeds")
        assert other.url == dead
        await other.close()
    finally:
        await server.stop()


def test_ask_another_trailer_gives_ask_another() -> None:
    trailers = (("ister-ask-another", "true"),)
    err = from_status(grpc.StatusCode.UNAVAILABLE, "broker 7 cannot renew its lease", trailers)
    assert isinstance(err, errors.AskAnother) and err.retriable
    plain = from_status(grpc.StatusCode.UNAVAILABLE, "topic moving", ())
    assert type(plain) is errors.Unavailable


async def test_a_seed_that_cannot_know_the_owner_sends_the_lookup_to_the_next_seed() -> None:
    """A broker cut off from the metadata store answers lookups with AskAnother (its view may be stale):
    the client's retry asks its next seed, where a plain UNAVAILABLE (a topic moving) keeps the seed."""
    from ister.client import Client
    from ister.server.errors import unary
    from tests.unit.test_client_support import FakeIster, FakeServer

    class Stale(FakeIster):
        @unary
        async def Lookup(self, request: object, context: object) -> object:
            raise errors.AskAnother("broker 1 cannot renew its lease; ask another broker")

    stale, good = FakeServer(Stale()), FakeServer()
    await stale.start()
    await good.start()
    try:
        good.servicer.records["/default/t"] = []
        async with Client([stale.url, good.url], connect_timeout=2.0) as client:
            assert client.url == stale.url
            found = await client.lookup_with_retry("/default/t")
            assert found is not None and found.partitions == ["/default/t"]
            assert client.url == good.url
    finally:
        await stale.stop()
        await good.stop()


async def test_a_lookup_on_a_seed_not_connected_also_asks_the_next_one() -> None:
    """A seed that accepts connections and never answers (a paused broker, or one slow to answer a new
    connection) holds a new connection for its whole attempt (5 s): the next seed, asked at the same
    time, answers the lookup and becomes the seed."""
    import asyncio
    import time

    from ister.client import Client
    from tests.unit.test_client_support import FakeServer

    held: list[asyncio.StreamWriter] = []

    async def silent(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # accepted by the kernel and the loop, never answered

    mute = await asyncio.start_server(silent, "127.0.0.1", 0)
    mute_url = f"http://127.0.0.1:{mute.sockets[0].getsockname()[1]}"
    good = FakeServer()
    await good.start()
    try:
        good.servicer.records["/default/t"] = []
        client = Client([mute_url, good.url], connect_timeout=10.0)  # 5 s a seed
        try:
            started = time.monotonic()
            found = await client.lookup("/default/t")
            elapsed = time.monotonic() - started
            assert found.partitions == ["/default/t"]
            assert client.url == good.url
            assert held, "the silent seed was not asked"
            assert elapsed < 2.5, f"the lookup waited {elapsed:.1f} s for the silent seed"
            # Connected now: the next lookup goes to the seed that answered, alone.
            assert (await client.lookup("/default/t")).partitions == ["/default/t"]
        finally:
            await client.close()
    finally:
        for writer in held:
            writer.close()
        mute.close()
        await good.stop()
