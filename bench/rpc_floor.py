"""What one unary gRPC call costs the server here: a Danube HealthCheck against `ister broker` and against
the no-op grpc.aio server (`ister.benchmark.noop_server`), session 11's "gRPC floor" (issue 21).

usage: python bench/rpc_floor.py [--calls 2000] [--rounds 2]

Each round sends `--calls` sequential HealthCheck calls from this process and reads the server's CPU
(user + system, /proc) before and after. Prints one JSON line per server and round: CPU µs per call and the
mean round trip. Set GRPC_EXPERIMENTS / GRPC_POLL_STRATEGY in the environment to try gRPC's variants (the
servers inherit it). Not a test: timings depend on the machine and its load. Results go to
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time

import grpc

from ister.benchmark.broker import BenchBroker
from ister.benchmark.stats import process_cpu_s
from ister.devcluster.ports import free_port, stop_process, wait_port
from ister.wire.gen import DanubeApi_pb2 as pb
from ister.wire.gen import DanubeApi_pb2_grpc as rpc


async def rounds(server: str, port: int, pid: int, calls: int, n_rounds: int) -> None:
    request = pb.HealthCheckRequest(request_id=1, client=pb.HealthCheckRequest.Producer, id=1)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = rpc.HealthCheckStub(channel)
        await stub.HealthCheck(request)  # connected before the clock starts
        for _ in range(n_rounds):
            cpu0, t0 = process_cpu_s(pid), time.perf_counter()
            for _ in range(calls):
                await stub.HealthCheck(request)
            wall, cpu = time.perf_counter() - t0, process_cpu_s(pid) - cpu0
            result = {
                "server": server,
                "cpu_us_per_call": round(cpu / calls * 1e6),
                "rtt_us": round(wall / calls * 1e6),
            }
            print(json.dumps(result), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with BenchBroker() as broker:
        asyncio.run(rounds("ister broker", broker.port, broker.pid, args.calls, args.rounds))
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ister.benchmark.noop_server", str(port), "0"])
    try:
        wait_port(port, proc, 30.0, "the no-op server")
        asyncio.run(rounds("no-op grpc.aio", port, proc.pid, args.calls, args.rounds))
    finally:
        stop_process(proc)


if __name__ == "__main__":
    main()
