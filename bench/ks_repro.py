"""Issue 14 item 0 reproduction: Key-Shared with the official danube-client against a real `ister broker`.

Runs the issue's scenario `--runs` times and prints how many runs lost messages. The broker runs from whatever
`ister` is importable (set PYTHONPATH to the tree under test).

Scenario: a reliable topic; two danube-client consumers on one Key-Shared subscription, both subscribed and
receiving, then 0.5 s; messages sent with send_with_key; each message acked as soon as it arrives.
  ring:    ten messages, two keys alternating
  filters: consumer A `payment`, B `ship*` and `invoice`; keys payment, shipping, payment, invoice, payment

Findings (2026-11-25, 30 runs each): neither the filing commit be87489 nor main lost a message (0/30 for both
variants on both, also with a fresh broker per run, a side producer/consumer pair, a reused topic, other
subscribe/receive orders, two clients). `--merge-wait` reproduces the reported figures on any broker version
(filters: 3 of 5 in every run; ring: half the runs lose a key) with a receive loop that awaits both queues
through asyncio.wait and leaves the pending get() behind: that orphaned task takes the next message from the
client's queue, nobody sees or acks it, and Key-Shared holds the key's later messages behind it until its ack
timeout (30 s). The script prints what the orphans took.

Usage: PYTHONPATH=<tree>/src python bench/ks_repro.py --runs 30 --variant {ring,filters} [options]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import danube

S = danube.SubType


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Broker:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        data = Path(tempfile.mkdtemp(dir=self.root))
        log = open(data.parent / f"{data.name}.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ister.cli",
                "broker",
                "--data-dir",
                str(data / "d"),
                "--broker-addr",
                f"127.0.0.1:{self.port}",
                "--admin-addr",
                f"127.0.0.1:{free_port()}",
                "--prom-exporter",
                f"127.0.0.1:{free_port()}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(os.environ),
        )
        log.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        raise TimeoutError("broker did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


async def run_once(
    url: str, topic: str, variant: str, wait: float, settle: float, opts: argparse.Namespace
) -> tuple[int, int, list]:
    c = await danube.DanubeClientBuilder().service_url(url).build()
    p = (
        c.new_producer()
        .with_topic(topic)
        .with_name("p")
        .with_dispatch_strategy(danube.DispatchStrategy.RELIABLE)
    )
    p = p.build()
    if not opts.consumers_first:
        await p.create()
    if variant == "ring":
        keys = ["alpha" if i % 2 == 0 else "beta" for i in range(10)]
        filters: dict[str, list[str]] | None = None
    else:
        keys = ["payment", "shipping", "payment", "invoice", "payment"]
        filters = {"a": ["payment"], "b": ["ship*", "invoice"]}
    got: list[tuple[str, str, int]] = []
    conss = []
    tasks = []
    builds = []
    for name in ("a", "b"):
        cc = await danube.DanubeClientBuilder().service_url(url).build() if opts.separate_clients else c
        b = cc.new_consumer().with_topic(topic).with_consumer_name("c" if opts.same_name else name)
        b = b.with_subscription("ks").with_subscription_type(S.KEY_SHARED)
        if filters is not None:
            b = b.with_key_filters(filters[name])
        builds.append((name, b.build()))

    queues: list[tuple[str, danube.Consumer, asyncio.Queue]] = []  # type: ignore[type-arg]

    def start(name: str, cons: danube.Consumer, q: asyncio.Queue) -> None:  # type: ignore[type-arg]
        if opts.merge_wait:
            queues.append((name, cons, q))
            return

        async def drain() -> None:
            while True:
                m = await q.get()
                got.append((name, m.routing_key, int(m.payload)))
                await cons.ack(m)

        tasks.append(asyncio.create_task(drain()))

    conss = [cons for _, cons in builds]
    if opts.order == "interleaved":  # a.subscribe, a.receive, b.subscribe, b.receive
        for name, cons in builds:
            await cons.subscribe()
            start(name, cons, await cons.receive())
    elif opts.order == "subscribe-all":  # a.subscribe, b.subscribe, a.receive, b.receive
        for _, cons in builds:
            await cons.subscribe()
        for name, cons in builds:
            start(name, cons, await cons.receive())
    else:  # gather: both subscribe at once, then both receive
        await asyncio.gather(*(cons.subscribe() for _, cons in builds))
        for name, cons in builds:
            start(name, cons, await cons.receive())
    if opts.consumers_first:
        await p.create()
    orphans: list[asyncio.Task] = []  # type: ignore[type-arg]
    if opts.merge_wait:

        async def merged() -> None:
            # One loop over both queues with asyncio.wait, the pending get() left behind (not cancelled):
            # the orphaned get() still takes the next message of its queue, and nobody sees or acks it.
            while True:
                gets = {asyncio.create_task(q.get()): (n, cons) for n, cons, q in queues}
                done, pending = await asyncio.wait(gets, return_when=asyncio.FIRST_COMPLETED)
                orphans.extend(pending)
                for t in done:
                    n, cons = gets[t]
                    m = t.result()
                    got.append((n, m.routing_key, int(m.payload)))
                    await cons.ack(m)

        tasks.append(asyncio.create_task(merged()))
    await asyncio.sleep(settle)
    for i, k in enumerate(keys):
        await p.send_with_key(str(i).encode(), {}, k)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and len({i for _, _, i in got}) < len(keys):  # noqa: ASYNC110
        await asyncio.sleep(0.02)
    for t in tasks:
        t.cancel()
    eaten = [int(t.result().payload) for t in orphans if t.done() and not t.cancelled()]
    if eaten:
        print(f"  taken from the client's queue by orphaned get() tasks, never seen nor acked: {eaten}")
    for t in orphans:
        t.cancel()
    for cons in conss:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(cons.close(), 5)
    with contextlib.suppress(Exception):
        await asyncio.wait_for(p.close(), 5)
    return len({i for _, _, i in got}), len(keys), got


async def background(url: str, tag: str, rate: float) -> None:
    """A healthy producer/consumer pair on another topic, running the whole time (as in the issue's probe)."""
    c = await danube.DanubeClientBuilder().service_url(url).build()
    topic = f"/default/bg_{tag}"
    p = (
        c.new_producer()
        .with_topic(topic)
        .with_name("bgp")
        .with_dispatch_strategy(danube.DispatchStrategy.RELIABLE)
    )
    p = p.build()
    await p.create()
    cons = c.new_consumer().with_topic(topic).with_consumer_name("bgc").with_subscription("bg").build()
    await cons.subscribe()
    q = await cons.receive()

    async def drain() -> None:
        while True:
            m = await q.get()
            await cons.ack(m)

    t = asyncio.create_task(drain())
    try:
        n = 0
        while True:
            await p.send(str(n).encode(), {})
            n += 1
            if rate:
                await asyncio.sleep(1 / rate)
    finally:
        t.cancel()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--variant", choices=["ring", "filters"], default="ring")
    ap.add_argument("--fresh-broker", action="store_true", help="a new broker process for every run")
    ap.add_argument("--same-topic", action="store_true", help="reuse one topic/subscription across runs")
    ap.add_argument("--wait", type=float, default=5.0)
    ap.add_argument("--settle", type=float, default=0.5)
    ap.add_argument("--url", default=None, help="use a running broker")
    ap.add_argument("--separate-clients", action="store_true")
    ap.add_argument("--same-name", action="store_true")
    ap.add_argument("--consumers-first", action="store_true")
    ap.add_argument("--background", type=float, default=None, help="side pair msgs/s (0: unpaced)")
    ap.add_argument("--order", choices=["interleaved", "subscribe-all", "gather"], default="interleaved")
    ap.add_argument("--merge-wait", action="store_true", help="a careless merged receive loop (see merged())")
    args = ap.parse_args()
    bg: asyncio.Task[None] | None = None
    root = Path(tempfile.mkdtemp(prefix="ksrepro-"))
    broker = None
    lost = 0
    tag = f"{os.getpid()}_{int(time.time())}"
    try:
        for n in range(args.runs):
            if args.url is None and (broker is None or args.fresh_broker):
                if broker is not None:
                    broker.stop()
                broker = Broker(root)
                broker.start()
            url = args.url or broker.url  # type: ignore[union-attr]
            if args.background is not None and (bg is None or args.fresh_broker):
                if bg is not None:
                    bg.cancel()
                bg = asyncio.create_task(background(url, f"{tag}_{n}", args.background))
                await asyncio.sleep(1)
            topic = f"/default/ks_{tag}" if args.same_topic else f"/default/ks_{tag}_{n}"
            arrived, total, got = await run_once(url, topic, args.variant, args.wait, args.settle, args)
            if arrived < total:
                lost += 1
            status = f"LOST {got}" if arrived < total else "ok"
            print(f"run {n}: {arrived}/{total} {status}", flush=True)
    finally:
        if broker is not None:
            broker.stop()
    print(f"RESULT {args.variant}: {lost}/{args.runs} runs lost messages", flush=True)
    sys.exit(1 if lost else 0)


if __name__ == "__main__":
    asyncio.run(main())
