"""The `ister` command and the benchmark tools run gRPC's classic I/O path (ister.grpc_io), in fresh
interpreters: gRPC reads its experiments once, at import."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from ister.grpc_io import CLASSIC_IO, ENV

# Imports the module under test first, then serves 2,000 unary calls on a grpc.aio server and reports the
# variable and the CPU ticks of gRPC's EventEngine threads (they do the socket I/O unless the classic path
# is on).
PROBE = """
import asyncio, json, os, sys
if sys.argv[1]:
    __import__(sys.argv[1])
import grpc

async def main():
    async def echo(request, context):
        return request
    server = grpc.aio.server()
    handler = grpc.unary_unary_rpc_method_handler(echo)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.T", {"E": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary("/t.T/E")
        for _ in range(2000):
            await call(b"x")
    ticks = 0  # counted before the server stops: idle EventEngine threads may end with it
    for tid in os.listdir("/proc/self/task"):
        stat = open(f"/proc/self/task/{tid}/stat").read()
        if stat[stat.index("(") + 1 : stat.rindex(")")] == "event_engine":
            fields = stat[stat.rindex(")") + 2 :].split()
            ticks += int(fields[11]) + int(fields[12])
    await server.stop(0)
    print(json.dumps({"env": os.environ.get("GRPC_EXPERIMENTS"), "event_engine_ticks": ticks}))

asyncio.run(main())
"""


def probe(module: str, **env: str) -> tuple[dict[str, object], str]:
    clean = {k: v for k, v in os.environ.items() if k != ENV}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, module],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_the_command_runs_grpc_io_on_the_poller_thread() -> None:
    got, stderr = probe("ister.cli.main")
    assert got["env"] == CLASSIC_IO
    assert "Unknown experiment" not in stderr  # the pinned grpcio still knows every name
    assert got["event_engine_ticks"] <= 1  # no socket I/O on EventEngine threads


def test_without_it_grpc_does_io_on_event_engine_threads() -> None:
    # The control for the test above: the same calls with gRPC's defaults keep EventEngine threads busy.
    got, _ = probe("")
    assert got["env"] is None
    assert int(str(got["event_engine_ticks"])) >= 3


def test_the_benchmark_tools_use_the_same_path() -> None:
    got, _ = probe("ister.benchmark")
    assert got["env"] == CLASSIC_IO


def test_a_value_in_the_environment_is_kept() -> None:
    got, _ = probe("ister.cli.main", GRPC_EXPERIMENTS="")  # empty: gRPC's own defaults
    assert got["env"] == ""
    assert int(str(got["event_engine_ticks"])) >= 3
