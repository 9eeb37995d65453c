"""Fuzz test: random and malformed requests to every RPC of the client, batch and admin APIs of a real broker.

The only statuses allowed are OK, INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION, RESOURCE_EXHAUSTED and
ALREADY_EXISTS (UNIMPLEMENTED for Raft membership, the one admin service Ister does not serve), never
INTERNAL or UNKNOWN; every
status message is short; the broker logs no traceback; and every message the broker accepted is stored and
delivered to an official danube-client consumer, and nothing it refused.

A run draws case i from `Random(f"{seed}:{i}")`. The seed is random per run and printed with any failure;
set FUZZ_SEED to replay one, FUZZ_CASES to change the number of cases (default 5,000). (Not ISTER_*: the
broker reads those as its configuration.)
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

import danube
import grpc
import pytest

from ister.limits import MAX_STATUS_MESSAGE_BYTES
from ister.wire.gen import DanubeAdmin_pb2 as apb
from ister.wire.gen import ister_v1_pb2 as ipb
from tests.integration.fuzzing import (
    ALLOWED,
    CLIENT_TOPICS,
    STATUS_LOST,
    UNIMPLEMENTED_SERVICES,
    VERIFY_SUBSCRIPTION,
    Driver,
    Gen,
    Outcome,
    Rpc,
    State,
    all_rpcs,
)
from tests.integration.harness import BrokerProcess, client, consumer, nothing_within, take

pytestmark = pytest.mark.integration

CASES = int(os.environ.get("FUZZ_CASES", "5000"))
WORKERS = 8
BUDGET_SECONDS = 50.0  # cases not started by then are skipped (and counted in the report)
WEIGHTS = {
    "/ister.v1.Ister/Publish": 14.0,
    "/danube.ProducerService/SendMessage": 10.0,
    "/ister.v1.Ister/Consume": 4.0,
    "/danube.ProducerService/CreateProducer": 4.0,
    "/danube.ConsumerService/Subscribe": 3.0,
    "/danube.ConsumerService/ReceiveMessages": 2.0,
}


@pytest.fixture
def fuzz_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(tmp_path / "data")
    broker.start()
    yield broker
    broker.stop()


def _weight(rpc: Rpc) -> float:
    if rpc.service in UNIMPLEMENTED_SERVICES:
        return 0.1
    return WEIGHTS.get(rpc.path, 1.0)


def _problem(outcome: Outcome, rpc: Rpc) -> str | None:
    if rpc.service in UNIMPLEMENTED_SERVICES:
        if outcome.code != grpc.StatusCode.UNIMPLEMENTED:
            return f"{outcome.code.name} (expected UNIMPLEMENTED)"
    elif outcome.code not in ALLOWED:
        return outcome.code.name
    if len(outcome.details.encode()) > MAX_STATUS_MESSAGE_BYTES:
        return f"a status message of {len(outcome.details.encode())} bytes"
    return None


async def _create_data_topics(admin: grpc.aio.Channel) -> None:
    stub = admin.unary_unary(
        "/danube_admin.TopicAdmin/CreateTopic",
        request_serializer=apb.NewTopicRequest.SerializeToString,
        response_deserializer=apb.TopicResponse.FromString,
    )
    for name, strategy in (("/default/fz_r0", 1), ("/default/fz_r1", 1), ("/default/fz_n0", 0)):
        await stub(apb.NewTopicRequest(name=name, dispatch_strategy=strategy), timeout=10)


async def _fuzz(broker: BrokerProcess, seed: int, state: State) -> tuple[int, list[str]]:
    rpcs = all_rpcs()
    weights = [_weight(r) for r in rpcs]
    failures: list[str] = []
    done = 0
    deadline = time.monotonic() + BUDGET_SECONDS
    async with (
        grpc.aio.insecure_channel(f"127.0.0.1:{broker.port}") as ch,
        grpc.aio.insecure_channel(broker.admin_addr) as admin,
    ):
        await _create_data_topics(admin)
        driver = Driver(ch, admin, state)

        async def worker(first: int) -> None:
            nonlocal done
            for case in range(first, CASES, WORKERS):
                if time.monotonic() > deadline or len(failures) >= 10:
                    return
                rng = random.Random(f"{seed}:{case}")
                rpc = rng.choices(rpcs, weights)[0]
                outcome = await driver.run(rpc, Gen(rng, state, case, admin=rpc.admin))
                lost = outcome.details == STATUS_LOST
                state.codes[rpc.path].add("status lost (grpc#36066)" if lost else outcome.code.name)
                problem = _problem(outcome, rpc)
                if problem is not None:
                    failures.append(f"case {case}: {problem}: {outcome.details[:300]!r}\n    {outcome.what}")
                done += 1

        await asyncio.gather(*(worker(w) for w in range(WORKERS)))
    return done, failures


async def _verify_delivery(broker: BrokerProcess, state: State) -> list[str]:
    """Every accepted message of every reliable topic is stored, nothing else, and a danube-client consumer
    receives them all."""
    problems: list[str] = []
    c = await client(broker.url)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.port}") as ch:
        offsets = ch.unary_unary(
            "/ister.v1.Ister/Offsets",
            request_serializer=ipb.OffsetsRequest.SerializeToString,
            response_deserializer=ipb.OffsetsResponse.FromString,
        )
        set_cursor = ch.unary_unary(
            "/ister.v1.Ister/SetCursor",
            request_serializer=ipb.SetCursorRequest.SerializeToString,
            response_deserializer=ipb.SetCursorResponse.FromString,
        )
        for topic in sorted(set(CLIENT_TOPICS) | set(state.accepted)):
            accepted = sorted(state.accepted.get(topic, []))
            try:
                found = await offsets(ipb.OffsetsRequest(topic=topic), timeout=10)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND and accepted:
                    problems.append(f"{topic}: {len(accepted)} messages accepted, topic not found")
                elif exc.code() not in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION):
                    problems.append(f"{topic}: Offsets answered {exc.code().name}")
                continue  # FAILED_PRECONDITION: non-reliable, nothing stored to check
            if (found.earliest, found.next) != (0, len(accepted)):
                problems.append(f"{topic}: stores {found.earliest}..{found.next}, {len(accepted)} accepted")
                continue
            if not accepted:
                continue
            await set_cursor(ipb.SetCursorRequest(topic=topic, subscription=VERIFY_SUBSCRIPTION, next=0))
            cons, q = await consumer(c, topic, "fz-verifier", VERIFY_SUBSCRIPTION, danube.SubType.EXCLUSIVE)
            got = await take(q, len(accepted), within=30, ack=cons)
            received = sorted(m.payload for m in got)
            if received != accepted:
                extra = sorted(set(received) - set(accepted))[:3]
                missing = sorted(set(accepted) - set(received))[:3]
                problems.append(
                    f"{topic}: received but not accepted {extra}, accepted but not received {missing}"
                )
            if {m.msg_id.topic_name for m in got} != {topic}:
                problems.append(f"{topic}: messages name another topic")
            if not await nothing_within(q, 0.3):
                problems.append(f"{topic}: more messages than were accepted")
            await cons.close()
    return problems


async def test_fuzz_every_rpc(fuzz_broker: BrokerProcess) -> None:
    seed = int(os.environ.get("FUZZ_SEED") or random.randrange(2**32))
    state = State()
    started = time.monotonic()
    done, failures = await _fuzz(fuzz_broker, seed, state)
    elapsed = time.monotonic() - started
    where = f"FUZZ_SEED={seed} ({done} cases in {elapsed:.1f} s)"
    assert not failures, f"{where}: disallowed statuses:\n" + "\n".join(failures)
    assert fuzz_broker.proc is not None and fuzz_broker.proc.poll() is None, f"{where}: the broker exited"
    problems = await _verify_delivery(fuzz_broker, state)
    assert not problems, f"{where}: delivery check failed:\n" + "\n".join(problems)
    log = fuzz_broker.log_path.read_text(errors="replace")
    for marker in ("Traceback", "internal error"):
        assert marker not in log, f"{where}: the broker log has {marker!r}:\n{fuzz_broker.log()}"
    accepted = {t: len(p) for t, p in state.accepted.items()}
    print(f"{where}; accepted messages {accepted}; statuses seen:")
    for rpc, codes in sorted(state.codes.items()):
        print(f"  {rpc}: {', '.join(sorted(codes))}")
