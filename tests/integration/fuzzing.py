"""Seeded request generators and drivers for the fuzz test (`test_fuzz.py`).

Every request is built from the RPC's protobuf descriptor, field by field, with values drawn from pools that
mix valid names and ids (so that many requests get past validation and change state) with invalid and
extreme ones: unknown enum numbers, integer edges, 10 KB names, control characters, garbage bodies, bodies
with flipped bytes. The batch API's records are msgpack arrays built here with one mutation or none. Case i
of a run draws everything from `Random(f"{seed}:{i}")`, so a failing case can be replayed by its seed.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import grpc
import msgspec
from danube.proto import DanubeApi_pb2 as dpb
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from ister.wire.gen import DanubeAdmin_pb2 as apb
from ister.wire.gen import SchemaRegistry_pb2 as spb
from ister.wire.gen import ister_v1_pb2 as ipb

Code = grpc.StatusCode
ALLOWED = frozenset(
    {
        Code.OK,
        Code.INVALID_ARGUMENT,
        Code.NOT_FOUND,
        Code.FAILED_PRECONDITION,
        Code.RESOURCE_EXHAUSTED,
        Code.ALREADY_EXISTS,
    }
)
# Served as UNIMPLEMENTED by design (docs/admin.md): Raft membership has no Ister equivalent.
UNIMPLEMENTED_SERVICES = ("danube_admin.ClusterAdmin",)

# Topics the client-API cases use (reliable data topics are created before the run) and the admin cases
# use: kept apart so that admin deletes and unloads cannot remove what the delivery check counts.
DATA_TOPICS = ("/default/fz_r0", "/default/fz_r1", "/default/fz_n0")
# A partition of a plain topic, and a name like a partition whose index is too large (a plain topic then).
CLIENT_TOPICS = (
    *DATA_TOPICS,
    "/default/fz_new",
    "/nope/fz",
    "/default/fz_r0-part-1",
    "/default/fz-part-9999999",
)
ADMIN_TOPICS = (
    "/fzadm/t0",
    "/fzadm/t1",
    "/fzadm/p",
    "/fzadm/p-part-0",
    "/fzadm/p-part-7",
    "/fzadm/p-part-9999999",
    "/default/fzadm",
)
ADMIN_NAMESPACES = ("fzadm", "fzadm2", "default", "nsnope")  # never "nope" (/nope/fz is a client topic)
CLIENT_NAMES = ("p0", "p1", "c0", "c1", "s0", "s1", "sub-é", "x y")
VERIFY_SUBSCRIPTION = "fz-verify"  # never drawn by the generator
CLIENT_WRITE_ARTIFACT = "Internal error from Core"  # what grpc/grpc#36066 turns a status into
STATUS_LOST = "status lost to grpc/grpc#36066"
BAD_STRINGS = (
    "",
    "no-slash",
    "/default",
    "/default/a/b",
    "/default/has space",
    "/déf/t",
    "//x",
    "\x00",
    "a\nb",
    "a/b",
    "-part-1",
    "x" * 256,
    "/default/" + "y" * 10_000,
    "z" * 10_000,
    "/default/" + "q" * 252,
)
_ALPHABET = "abcXYZ09_-/. é€\x01\x7f\u2028😀"

U64_EDGES = (0, 1, 2, 7, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1)
U32_EDGES = (0, 1, 2, 7, 100, 10_000, 10_001, 2**31, 2**32 - 1)
I32_EDGES = (0, 1, 2, 3, 4, -1, 99, 2**31 - 1, -(2**31))
_OFFSET_FIELDS = {"topic_offset", "first", "last", "upto", "start", "end", "next", "after_offset"}
_ID_FIELDS = {"producer_id", "consumer_id", "id"}
_REPLICATION_FIELDS = {"replication_factor", "min_insync_replicas"}
_CLIENT_NAME_FIELDS = {"producer_name", "consumer_name", "subscription", "subscription_name"}


@dataclass
class State:
    """What the run learned (ids to reuse) and what the broker accepted (for the delivery check)."""

    producers: dict[int, str] = field(default_factory=dict)  # producer id -> topic
    consumers: set[int] = field(default_factory=set)
    accepted: dict[str, list[bytes]] = field(default_factory=lambda: defaultdict(list))  # topic -> payloads
    codes: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))  # rpc -> statuses seen


@dataclass
class Outcome:
    rpc: str
    code: grpc.StatusCode
    details: str
    what: str  # a short description of the request, for the failure message


class Gen:
    """Draws the values of one case."""

    def __init__(self, rng: random.Random, state: State, case: int, *, admin: bool) -> None:
        self.rng = rng
        self.state = state
        self.case = case
        self.admin = admin
        self.payloads = 0

    def payload(self) -> bytes:
        self.payloads += 1
        tail = self.rng.randbytes(self.rng.choice((0, 1, 16, 300)))
        return b"fz:%d:%d:" % (self.case, self.payloads) + tail

    def text(self) -> str:
        return "".join(self.rng.choice(_ALPHABET) for _ in range(self.rng.randint(0, 12)))

    def _pick(self, valid: tuple[str, ...]) -> str:
        r = self.rng.random()
        if r < 0.7:
            return self.rng.choice(valid)
        if r < 0.92:
            return self.rng.choice(BAD_STRINGS)
        return self.text()

    def topic(self) -> str:
        return self._pick(ADMIN_TOPICS if self.admin else CLIENT_TOPICS)

    def string(self, desc: FieldDescriptor) -> str:
        name, owner = desc.name, desc.containing_type.name
        if (name in ("name", "base_name") and owner in ("NamespaceRequest",)) or name == "namespace":
            return self._pick(ADMIN_NAMESPACES)
        if name in ("topic", "topic_name", "name", "base_name", "dead_letter_topic"):
            return self.topic()
        if name in _CLIENT_NAME_FIELDS:
            return self._pick(CLIENT_NAMES)
        if name == "broker_id":
            return self.rng.choice(("0", "1", "", "abc", "007", "18446744073709551616", "9" * 300))
        if name in ("key_filters", "namespaces_include", "namespaces_exclude"):
            return self.rng.choice(("*", "k?", "", "a*b", "k" * 2000, self.text()))
        if name == "reason":
            return self.rng.choice(("bad", "", "r" * 1025, "é" * 600))
        if name == "schema_subject":
            return self.rng.choice(("", "subject"))
        return self._pick(("x", "ok"))

    def integer(self, desc: FieldDescriptor) -> int:
        rng, name = self.rng, desc.name
        unsigned64 = desc.type == FieldDescriptor.TYPE_UINT64
        if name in _ID_FIELDS and rng.random() < 0.7:
            known = list(self.state.producers if name == "producer_id" else self.state.consumers)
            if name == "id":
                known += list(self.state.producers)
            if desc.type == FieldDescriptor.TYPE_UINT32:  # a dictionary id: only ids that fit
                known = [k for k in known if k < 2**32]
            if known:
                return rng.choice(known)
        if name in _OFFSET_FIELDS and rng.random() < 0.7:
            return rng.randint(0, 20)
        if name == "window" and rng.random() < 0.5:
            return rng.randint(0, 12)
        if name in _REPLICATION_FIELDS and rng.random() < 0.7:
            return rng.randint(0, 6)  # around the valid 1..5 (standalone: above 1 is refused)
        if desc.type == FieldDescriptor.TYPE_INT32:
            return rng.choice(I32_EDGES)
        if unsigned64:
            return rng.choice(U64_EDGES)
        return rng.choice(U32_EDGES)

    def enum(self, desc: FieldDescriptor) -> int:
        numbers = [v.number for v in desc.enum_type.values]
        if self.rng.random() < 0.8:
            return self.rng.choice(numbers)
        return self.rng.choice((max(numbers) + 1, 99, -1, 2**31 - 1))

    def message(self, desc: Descriptor, depth: int = 0) -> Message:
        """A message of type `desc` with each field set (or left at its default) at random."""
        msg: Message = GetMessageClass(desc)()
        for f in desc.fields:
            if self.rng.random() < 0.2:
                continue
            mt = f.message_type
            if mt is not None and mt.GetOptions().map_entry:
                target = getattr(msg, f.name)
                key_f, value_f = mt.fields_by_name["key"], mt.fields_by_name["value"]
                if key_f.type == value_f.type == FieldDescriptor.TYPE_STRING:
                    for k, v in self.attributes().items():
                        target[k] = v
                elif value_f.message_type is None:  # e.g. map<string, uint64>: scalars of the entry's types
                    for _ in range(self.rng.choice((0, 1, 2, 3))):
                        target[self.scalar(key_f)] = self.scalar(value_f)
            elif f.is_repeated:
                target = getattr(msg, f.name)
                n = self.rng.choice((0, 1, 2, 3))
                for _ in range(n):
                    if mt is not None:
                        target.add().CopyFrom(self.message(mt, depth + 1))
                    else:
                        target.append(self.scalar(f))
            elif mt is not None:
                if depth < 3:
                    getattr(msg, f.name).CopyFrom(self.message(mt, depth + 1))
            else:
                setattr(msg, f.name, self.scalar(f))
        return msg

    def scalar(self, f: FieldDescriptor) -> Any:
        t = f.type
        if t == FieldDescriptor.TYPE_STRING:
            return self.string(f)
        if t == FieldDescriptor.TYPE_BYTES:
            return self.payload() if f.name == "payload" else self.rng.randbytes(self.rng.randint(0, 40))
        if t == FieldDescriptor.TYPE_BOOL:
            return self.rng.random() < 0.5
        if t == FieldDescriptor.TYPE_ENUM:
            return self.enum(f)
        if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
            return self.rng.choice((0.0, -1.0, 1e300))
        return self.integer(f)

    def attributes(self) -> dict[str, str]:
        r = self.rng.random()
        if r < 0.5:
            return {}
        if r < 0.8:
            return {self.text(): self.text() for _ in range(self.rng.randint(1, 3))}
        if r < 0.87:
            return {f"k{i}": "v" for i in range(self.rng.choice((256, 257)))}
        if r < 0.94:
            return {"k": "é" * self.rng.choice((32_767, 32_768))}  # UTF-8 bytes at and past the limit
        return {"": ""}

    # -- batch API records ---------------------------------------------------------------------------------
    def records(self, producer_id: int, producer_name: str) -> tuple[bytes, int, list[bytes]]:
        """(records, count, payloads) of a PublishBatch: valid records, with one mutation or none."""
        rng = self.rng
        n = rng.choice((1, 1, 2, 5))
        recs: list[list[Any]] = []
        for _ in range(n):
            key = rng.choice((None, None, "k", "r" * 1020))
            publish_time = rng.choice((0, 1_700_000_000_000, 2**64 - 1))
            attributes = self.attributes() if rng.random() < 0.3 else {}
            schema_id, schema_version = rng.choice((None, 0, 2**64 - 1)), rng.choice((None, 0, 2**32 - 1))
            head = [self.payload(), publish_time, producer_id, producer_name]
            recs.append([*head, attributes, key, schema_id, schema_version])
        count = n
        if rng.random() < 0.6:
            count = self._mutate(recs, count)
        data = msgspec.msgpack.encode(recs)
        if rng.random() < 0.03:
            data = _flip(rng, data)
        return data, count, _payloads(data)

    def _mutate(self, recs: list[list[Any]], count: int) -> int:
        rng = self.rng
        rec = rng.choice(recs)
        deep = msgspec.Raw(b"\x91" * 100_000 + b"\xc0")
        kind = rng.randrange(14)
        if kind == 0:
            rec[1] = rng.choice((-1, -(2**63), 1.5, "now", None, True))
        elif kind == 1:
            rec[2] = rng.choice((-1, rec[2] ^ 1, "id"))
        elif kind == 2:
            rec[3] = rng.choice(("someone-else", "", 7))
        elif kind == 3:
            rec[4] = rng.choice(({1: "x"}, {"k": 1}, [1, 2], "attrs", deep))
        elif kind == 4:
            rec[5] = rng.choice(("r" * 1021, 5, b"key", deep))
        elif kind == 5:
            rec[6] = rng.choice((-1, -(2**63), "id", 1.0))
        elif kind == 6:
            rec[7] = rng.choice((-1, 2**32, 2**63, "v"))
        elif kind == 7:
            rec.append(rng.choice((1, "extra", None)))
        elif kind == 8:
            del rec[rng.choice((3, 4, 5))]  # too short (3: producer name missing) or defaults (valid)
        elif kind == 9:
            rec[0] = rng.choice(("payload-as-str", 5, None, deep))
        elif kind == 10:
            return rng.choice((count - 1, count + 1, 2**32 - 1))
        elif kind == 11:
            recs.clear()
            return 0
        elif kind == 12:
            recs[recs.index(rec)] = rng.choice(("not-a-record", 5, None, {}))  # type: ignore[call-overload]
        else:
            rec[1] = 2**64 - 1  # a valid edge: must be accepted and delivered
        return count


def _payloads(data: bytes) -> list[bytes]:
    """The payloads the broker stores if it accepts these records (read back from what is sent, which
    may have been changed after it was built)."""
    try:
        recs = msgspec.msgpack.decode(data)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        return []
    if not isinstance(recs, list):
        return []
    return [r[0] for r in recs if isinstance(r, list) and r and isinstance(r[0], bytes)]


def _flip(rng: random.Random, data: bytes) -> bytes:
    """`data` with a few bytes changed, or cut short."""
    if not data:
        return rng.randbytes(8)
    b = bytearray(data)
    if rng.random() < 0.3:
        return bytes(b[: rng.randrange(len(b))])
    for _ in range(rng.randint(1, 4)):
        b[rng.randrange(len(b))] = rng.randrange(256)
    return bytes(b)


def _describe(rpc: str, msg: Message | bytes) -> str:
    text = repr(msg) if isinstance(msg, bytes) else str(msg).replace("\n", " ")
    return f"{rpc} {text[:300]}"


# -- drivers -------------------------------------------------------------------------------------------------
_SERVICES: tuple[tuple[Any, str], ...] = (
    (dpb, "ProducerService"),
    (dpb, "ConsumerService"),
    (dpb, "Discovery"),
    (dpb, "HealthCheck"),
    (ipb, "Ister"),
    (apb, "TopicAdmin"),
    (apb, "NamespaceAdmin"),
    (apb, "BrokerAdmin"),
    (apb, "ClusterAdmin"),
    (apb, "SecurityAdmin"),
    (spb, "SchemaRegistry"),
    (ipb, "IsterAdmin"),
)


@dataclass(frozen=True)
class Rpc:
    path: str  # /package.Service/Method
    service: str
    request: Descriptor
    response: Any  # message class
    client_streaming: bool
    server_streaming: bool

    @property
    def admin(self) -> bool:
        return self.service.startswith("danube_admin.") or self.service == "ister.v1.IsterAdmin"


def all_rpcs() -> list[Rpc]:
    out = []
    for module, name in _SERVICES:
        service = module.DESCRIPTOR.services_by_name[name]
        for m in service.methods:
            out.append(
                Rpc(
                    f"/{service.full_name}/{m.name}",
                    service.full_name,
                    m.input_type,
                    GetMessageClass(m.output_type),
                    m.client_streaming,
                    m.server_streaming,
                )
            )
    return out


class Driver:
    """Sends one generated request of an RPC and returns its status; learns ids from what succeeds."""

    LINGER = 0.2  # how long a stream that may legitimately stay open is watched before it is cancelled
    TIMEOUT = 15.0  # no call may take longer than this (a hang is a failure)

    def __init__(self, client: grpc.aio.Channel, admin: grpc.aio.Channel, state: State) -> None:
        self.client = client
        self.admin_channel = admin
        self.state = state

    def _channel(self, rpc: Rpc) -> grpc.aio.Channel:
        return self.admin_channel if rpc.admin else self.client

    async def run(self, rpc: Rpc, gen: Gen) -> Outcome:
        if rpc.path == "/ister.v1.Ister/Publish":
            return await self._publish(rpc, gen)
        if rpc.path == "/ister.v1.Ister/Consume":
            return await self._consume(rpc, gen)
        msg: Message | bytes = gen.message(rpc.request)
        if rpc.path == "/danube.ProducerService/SendMessage":
            msg = self._send_message(gen)
        r = gen.rng.random()
        if r < 0.04:
            msg = gen.rng.randbytes(gen.rng.randint(1, 64))
        elif r < 0.08:
            msg = _flip(gen.rng, msg.SerializeToString() if isinstance(msg, Message) else msg)
        body = msg.SerializeToString() if isinstance(msg, Message) else msg
        if rpc.server_streaming:
            call = self._channel(rpc).unary_stream(
                rpc.path, request_serializer=None, response_deserializer=None
            )
            code, details, _ = await _drain(call(body, timeout=self.TIMEOUT), self.LINGER)
            return Outcome(rpc.path, code, details, _describe(rpc.path, msg))
        unary = self._channel(rpc).unary_unary(rpc.path, request_serializer=None, response_deserializer=None)
        try:
            raw = await unary(body, timeout=self.TIMEOUT)
        except grpc.aio.AioRpcError as exc:
            return Outcome(rpc.path, exc.code(), exc.details() or "", _describe(rpc.path, msg))
        # What the broker accepted is what it decoded: a changed body may still be a valid message.
        self._learn(rpc, GetMessageClass(rpc.request).FromString(body), rpc.response.FromString(raw))
        return Outcome(rpc.path, Code.OK, "", _describe(rpc.path, msg))

    def _send_message(self, gen: Gen) -> Message:
        msg = gen.message(dpb.StreamMessage.DESCRIPTOR)
        assert isinstance(msg, dpb.StreamMessage)
        msg.payload = gen.payload()
        producers = self.state.producers
        if producers and gen.rng.random() < 0.8:
            pid = gen.rng.choice(list(producers))
            msg.msg_id.producer_id = pid
            if gen.rng.random() < 0.7:
                msg.msg_id.topic_name = gen.rng.choice((producers[pid], ""))
        return msg

    def _learn(self, rpc: Rpc, request: Message, response: Message) -> None:
        if rpc.path == "/danube.ProducerService/CreateProducer":
            self.state.producers[response.producer_id] = request.topic_name  # type: ignore[attr-defined]
        elif rpc.path == "/danube.ConsumerService/Subscribe":
            self.state.consumers.add(response.consumer_id)  # type: ignore[attr-defined]
        elif rpc.path == "/danube.ProducerService/SendMessage":
            assert isinstance(request, dpb.StreamMessage)
            topic = self.state.producers.get(request.msg_id.producer_id)
            if topic is not None:
                self.state.accepted[topic].append(request.payload)

    async def _publish(self, rpc: Rpc, gen: Gen) -> Outcome:
        """Open, then one batch at a time, each written only once the previous one was answered: a write
        after the server ended the stream would make the client report INTERNAL (grpc/grpc#36066)."""
        rng = gen.rng
        opened = gen.message(ipb.PublishOpen.DESCRIPTOR)
        assert isinstance(opened, ipb.PublishOpen)
        if rng.random() < 0.7:
            opened.topic = rng.choice(CLIENT_TOPICS[:3])
            opened.delivery = rng.choice((ipb.RELIABLE, ipb.RELIABLE, ipb.NON_RELIABLE, 7))
        first = ipb.PublishRequest(open=opened)
        if rng.random() < 0.05:
            first = ipb.PublishRequest(batch=ipb.PublishBatch(sequence=1, records=b"\x90", count=0))
        call = self.client.stream_stream(rpc.path, request_serializer=None, response_deserializer=None)(
            timeout=self.TIMEOUT
        )
        what = _describe(rpc.path, first)
        if not await _write(call, first.SerializeToString()) or (head := await _read(call)) is None:
            return await _finish(call, rpc.path, what)
        producer_id = ipb.PublishResponse.FromString(head).opened.producer_id
        self.state.producers.setdefault(producer_id, opened.topic)
        sequence = 0
        for _ in range(rng.choice((1, 1, 2, 3))):
            sequence = max(0, sequence + rng.choice((1, 1, 1, 0, -1)))
            name = opened.producer_name if rng.random() < 0.9 else "other"
            records, count, payloads = gen.records(producer_id, name)
            body = ipb.PublishRequest(
                batch=ipb.PublishBatch(sequence=sequence, records=records, count=count)
            ).SerializeToString()
            if rng.random() < 0.03:
                body = rng.randbytes(rng.randint(1, 30))
            elif rng.random() < 0.03:
                body = ipb.PublishRequest(open=opened).SerializeToString()  # a second open frame
            what += f" | batch seq={sequence} count={count} records={records[:120]!r}"
            if not await _write(call, body) or (raw := await _read(call)) is None:
                return await _finish(call, rpc.path, what)
            ack = ipb.PublishResponse.FromString(raw).ack
            assert ack.sequence == sequence and ack.count == len(payloads), what
            self.state.accepted[opened.topic].extend(payloads)
        with contextlib.suppress(grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError):
            await call.done_writing()
        while await _read(call) is not None:
            pass
        return await _finish(call, rpc.path, what)

    async def _consume(self, rpc: Rpc, gen: Gen) -> Outcome:
        """Open, then (once the open is answered) one or two Ack/Nack/garbage frames."""
        rng = gen.rng
        opened = gen.message(ipb.ConsumeOpen.DESCRIPTOR)
        assert isinstance(opened, ipb.ConsumeOpen)
        if rng.random() < 0.6:
            opened.topic = rng.choice(CLIENT_TOPICS[:3])
            opened.subscription = rng.choice(CLIENT_NAMES[4:6])
        call = self.client.stream_stream(rpc.path, request_serializer=None, response_deserializer=None)(
            timeout=self.TIMEOUT
        )
        frames = [ipb.ConsumeRequest(open=opened).SerializeToString()]
        what = f"{rpc.path} {frames!r}"[:600]
        if not await _write(call, frames[0]) or await _read(call) is None:
            return await _finish(call, rpc.path, what)
        for _ in range(rng.choice((0, 1, 2))):
            kind = rng.randrange(6)
            if kind < 2:
                frames.append(ipb.ConsumeRequest(ack=gen.message(ipb.Ack.DESCRIPTOR)).SerializeToString())
            elif kind < 4:
                frames.append(ipb.ConsumeRequest(nack=gen.message(ipb.Nack.DESCRIPTOR)).SerializeToString())
            elif kind == 4:
                frames.append(rng.choice((b"", ipb.ConsumeRequest(open=opened).SerializeToString())))
            else:
                frames.append(rng.randbytes(rng.randint(1, 30)))
        if rng.random() < 0.02:
            ranges = [ipb.OffsetRange(first=i, last=i) for i in range(10_001)]
            frames.append(ipb.ConsumeRequest(ack=ipb.Ack(ranges=ranges)).SerializeToString())
        what = f"{rpc.path} {[f[:80] for f in frames]!r}"[:600]
        wrote_all = True
        for body in frames[1:]:
            if not await _write(call, body):
                wrote_all = False
                break
        with contextlib.suppress(grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError):
            await call.done_writing()
        code, details, _ = await _drain(call, self.LINGER)
        if not wrote_all and (code, details) == (Code.INTERNAL, CLIENT_WRITE_ARTIFACT):
            # A frame ended the stream (or a takeover did) while the next was being written: the client
            # then replaces the server's status by this one (grpc/grpc#36066). The broker log check still
            # sees any server-side error.
            return Outcome(rpc.path, Code.OK, STATUS_LOST, what)
        return Outcome(rpc.path, code, details, what)


async def _write(call: Any, body: bytes) -> bool:
    try:
        await call.write(body)
    except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError):
        return False  # the call already ended (its status is read afterwards)
    return True


async def _read(call: Any) -> bytes | None:
    try:
        raw = await call.read()
    except grpc.aio.AioRpcError:
        return None
    return None if raw is grpc.aio.EOF else bytes(raw)


async def _finish(call: Any, path: str, what: str) -> Outcome:
    code = await call.code()
    return Outcome(path, code, await call.details() or "", what[:800])


async def _drain(call: Any, linger: float) -> tuple[grpc.StatusCode, str, bool]:
    """Read a response stream to its end, or cancel it after `linger` seconds without an end (a consumer
    stream stays open while it waits for messages). Returns (status, details, cancelled_by_us)."""

    async def reader() -> None:
        while await _read(call) is not None:
            pass

    task = asyncio.create_task(reader())
    done, _ = await asyncio.wait({task}, timeout=linger)
    cancelled = not done
    if cancelled:
        call.cancel()
    with contextlib.suppress(Exception, asyncio.CancelledError):
        await task
    code = await call.code()
    if cancelled and code == Code.CANCELLED:
        return Code.OK, "", True  # open and healthy when we stopped watching
    return code, await call.details() or "", cancelled
