"""The batch-API cases (`ister.client`): durable publish, consume + ack, end-to-end latency at a fixed rate.

All on one reliable topic per case, 100-byte payloads, one broker process (fsync as the suite asks).

publish      `workers` tasks each loop `await producer.send_batch(<batch> payloads)` until `messages` are
             sent (or `time_limit` passes), so up to `workers` batches are in flight on the producer's one
             stream; every batch is acked by the broker only once it is on disk. Latency = send_batch
             round trip.
consume_ack  a subscription created before publishing reads everything back: `receive_batch(window)`, then
             `ack_batch()` of what arrived (acks go as offset ranges); the clock stops after `close()` has
             sent the last acks. A second consumer then checks nothing is left unacknowledged (not timed).
e2e_latency  this process hands one message to the producer every 1/rate s (`send_nowait()`, linger 0: an
             open loop, so a slow ack never delays the next send; each ack's round trip is recorded); a
             consumer in another process (multiprocessing spawn) receives with `receive_batch()` and acks;
             latency = receive time minus the CLOCK_MONOTONIC stamp in the payload; the first 100 samples
             are dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import time
from collections.abc import Callable, Coroutine
from functools import partial
from queue import Empty
from typing import Any

import uvloop

from ister.benchmark.stats import (
    PAYLOAD,
    host_cpu_share,
    host_cpu_ticks,
    latency_result,
    latency_us,
    rate,
    stamp_age_s,
    stamped_payload,
    stop_child,
)
from ister.client import Client

CpuProbe = Callable[[], float]
SUBSCRIPTION = "bench-sub"
CONSUMER = "bench-consumer"
PUBLISH_BATCH = 4096  # messages per send_batch (the client's default max_batch_messages)
PUBLISH_IN_FLIGHT = 8  # send_batch calls in flight
MAX_WINDOW = 10_000


async def publish(
    url: str,
    topic: str,
    messages: int,
    *,
    batch: int = PUBLISH_BATCH,
    workers: int = PUBLISH_IN_FLIGHT,
    time_limit: float = 60.0,
    broker_cpu: CpuProbe | None = None,
    idempotent: bool = True,
    payloads: list[bytes] | None = None,
    compression: str = "none",
) -> dict[str, Any]:
    """Durable publish through send_batch with `workers` batches in flight. The subscription the consume
    case reads is created first, so it holds every message published here. `payloads`: sent in turn
    (default: the 100-byte PAYLOAD); `compression`: the producer's codec."""
    async with Client(url) as client:
        producer = await client.producer(
            topic,
            "bench-publisher",
            reliable=True,
            max_batch_messages=batch,
            max_inflight_batches=workers,
            max_buffered_messages=max(262_144, 2 * batch * workers),
            idempotent=idempotent,
            compression=compression,
        )
        consumer = await client.consumer(topic, SUBSCRIPTION, name=CONSUMER, window=MAX_WINDOW)
        await consumer.close()  # the subscription stays, its cursor at offset 0
        chunk = [PAYLOAD] * batch if payloads is None else (payloads * (batch // len(payloads) + 1))[:batch]
        await producer.send_batch(chunk)  # warm-up (read back by the consume case too)
        sent = 0
        rtts: list[float] = []
        cpu0 = broker_cpu() if broker_cpu else 0.0
        t0 = time.perf_counter()
        stop_at = t0 + time_limit

        async def worker() -> None:
            nonlocal sent
            while sent < messages and time.perf_counter() < stop_at:
                take = min(batch, messages - sent)
                sent += take
                started = time.perf_counter()
                await producer.send_batch(chunk if take == batch else chunk[:take])
                rtts.append(time.perf_counter() - started)

        await asyncio.gather(*(worker() for _ in range(workers)))
        wall = time.perf_counter() - t0
        cpu = (broker_cpu() - cpu0) if broker_cpu else 0.0
        await producer.close()
    out = rate(sent, wall)
    out.update(
        latency_us=latency_us(rtts),
        latency_of="send_batch round trip",
        total_published=sent + batch,
        batch=batch,
        in_flight=workers,
        broker_cpu_us_per_msg=cpu / sent * 1e6 if sent else 0.0,
    )
    return out


async def consume_ack(
    url: str, topic: str, expected: int, *, window: int = MAX_WINDOW, broker_cpu: CpuProbe | None = None
) -> dict[str, Any]:
    """Read `expected` messages of SUBSCRIPTION back from offset 0, acking every one (as ranges)."""
    async with Client(url) as client:
        consumer = await client.consumer(topic, SUBSCRIPTION, name=CONSUMER, window=window)
        got = 0
        out_of_order = 0
        cpu0 = broker_cpu() if broker_cpu else 0.0
        t0 = time.perf_counter()
        while got < expected:
            batch = await consumer.receive_batch(window, timeout=15.0)
            if not batch:
                raise RuntimeError(f"consume + ack: got {got} of {expected} messages, then nothing for 15 s")
            if batch[0].offset != got or batch[-1].offset != got + len(batch) - 1:
                out_of_order += 1
            await consumer.ack_batch(batch)
            got += len(batch)
        await consumer.close()  # sends the acks still pending
        wall = time.perf_counter() - t0
        cpu = (broker_cpu() - cpu0) if broker_cpu else 0.0
        check = await client.consumer(topic, SUBSCRIPTION, name=CONSUMER, window=window)
        left = await check.receive_batch(window, timeout=1.0)
        await check.close()
    out = rate(got, wall)
    out.update(
        window=window,
        out_of_order_batches=out_of_order,
        unacked_after=len(left),
        broker_cpu_us_per_msg=cpu / got * 1e6 if got else 0.0,
    )
    return out


def _latency_consumer(url: str, topic: str, n: int, ready: Any, out: Any) -> None:
    """Child process (spawn): receive n stamped messages, ack them, hand back the latencies in seconds."""

    async def run() -> list[float]:
        async with Client(url) as client:
            consumer = await client.consumer(topic, "lat-sub", window=1000)
            ready.put(True)
            lats: list[float] = []
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(n / 100 + 60):  # a bound, should messages go missing
                    while len(lats) < n:
                        batch = await consumer.receive_batch(1000, timeout=None)
                        now = time.monotonic_ns()
                        lats.extend(stamp_age_s(m.payload, now) for m in batch)
                        consumer.ack_batch_nowait(batch)
            await consumer.close()
            return lats

    out.put(uvloop.run(run()))


def _ack_time(rtts: list[float], sent_at: float, _: asyncio.Future[int]) -> None:
    rtts.append(time.perf_counter() - sent_at)


async def _wait_child(proc: Any, queue: Any, timeout: float) -> Any:  # noqa: ASYNC109
    """The next item of `queue` from child `proc`; RuntimeError when the child dies or time runs out."""
    loop = asyncio.get_running_loop()
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await loop.run_in_executor(None, queue.get, True, 0.5)
        except Empty:
            if not proc.is_alive():
                raise RuntimeError(f"the latency consumer process exited with {proc.exitcode}") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"no answer from the latency consumer within {timeout:.0f} s") from None


async def e2e_latency(
    url: str, topic: str, *, rate_per_s: int = 1000, seconds: float = 10.0, broker_cpu: CpuProbe | None = None
) -> dict[str, Any]:
    n = int(rate_per_s * seconds)
    async with Client(url) as client:
        producer = await client.producer(topic, "lat-publisher", reliable=True, linger_ms=0)
        ctx = mp.get_context("spawn")
        ready = ctx.Queue()
        results = ctx.Queue()
        proc = ctx.Process(target=_latency_consumer, args=(url, topic, n, ready, results), daemon=True)
        proc.start()
        try:
            await _wait_child(proc, ready, 60.0)
            await asyncio.sleep(0.5)
            rtts: list[float] = []
            acks: list[asyncio.Future[int]] = []
            late = 0
            cpu0 = broker_cpu() if broker_cpu else 0.0
            start = time.perf_counter()
            for i in range(n):
                delay = start + i / rate_per_s - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                else:
                    late += 1
                ack = producer.send_nowait(stamped_payload())
                ack.add_done_callback(partial(_ack_time, rtts, time.perf_counter()))
                acks.append(ack)
            await asyncio.gather(*acks)
            wall = time.perf_counter() - start
            cpu = (broker_cpu() - cpu0) if broker_cpu else 0.0
            lats: list[float] = await _wait_child(proc, results, seconds + 90)
        finally:
            stop_child(proc)
    return latency_result(n, wall, lats, rtts, late, broker_cpu_us_per_msg=cpu / n * 1e6 if n else 0.0)


async def idempotence_cost(
    url: str, messages: int, *, rounds: int = 3, broker_cpu: CpuProbe | None = None
) -> dict[str, Any]:
    """The publish case with idempotence off and on, alternating (off/on, then on/off, ...) on fresh topics
    of one broker so that drift favours neither; medians of `rounds` runs each, and the cost in %."""
    runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    for r in range(rounds):
        for flag in (False, True) if r % 2 == 0 else (True, False):
            topic = f"/default/bench_idempotence_{'on' if flag else 'off'}_{r}"
            runs[flag].append(await publish(url, topic, messages, broker_cpu=broker_cpu, idempotent=flag))

    def median(flag: bool, key: str) -> float:
        values = sorted(float(x[key]) for x in runs[flag])
        return values[len(values) // 2]

    off, on = median(False, "msgs_per_s"), median(True, "msgs_per_s")
    cpu_off, cpu_on = median(False, "broker_cpu_us_per_msg"), median(True, "broker_cpu_us_per_msg")
    return {
        "messages": messages,
        "rounds": rounds,
        "off_msgs_per_s": off,
        "on_msgs_per_s": on,
        "cost_pct": (off - on) / off * 100 if off else 0.0,
        "off_broker_cpu_us_per_msg": cpu_off,
        "on_broker_cpu_us_per_msg": cpu_on,
        "off_runs": [x["msgs_per_s"] for x in runs[False]],
        "on_runs": [x["msgs_per_s"] for x in runs[True]],
    }


def run_all(
    url: str,
    *,
    messages: int,
    latency_seconds: float,
    cases: frozenset[str],
    broker_cpu: CpuProbe | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """The selected batch-API cases against one broker; keys ister_publish, ister_consume_ack, ister_e2e,
    ister_idempotence (only when asked: `--cases idempotence`)."""
    out: dict[str, Any] = {}
    topic = "/default/bench_batch"

    def timed(key: str, case: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
        before = host_cpu_ticks()
        result = uvloop.run(case)
        result["host_cpu"] = host_cpu_share(before, host_cpu_ticks())
        out[key] = result
        return result

    if "publish" in cases or "consume" in cases:
        progress(f"batch API: durable publish of {messages:,} messages")
        pub = timed("ister_publish", publish(url, topic, messages, broker_cpu=broker_cpu))
        if "consume" in cases:
            progress(f"batch API: consume + ack of {pub['total_published']:,} messages")
            timed("ister_consume_ack", consume_ack(url, topic, pub["total_published"], broker_cpu=broker_cpu))
        if "publish" not in cases:
            del out["ister_publish"]
    if "idempotence" in cases:
        progress(f"batch API: idempotence off vs on, 3 x 2 publishes of {messages:,} messages")
        timed("ister_idempotence", idempotence_cost(url, messages, broker_cpu=broker_cpu))
    if "latency" in cases:
        progress(f"batch API: e2e latency at 1,000 msg/s for {latency_seconds:g} s")
        timed(
            "ister_e2e",
            e2e_latency(url, "/default/bench_latency", seconds=latency_seconds, broker_cpu=broker_cpu),
        )
    return out
