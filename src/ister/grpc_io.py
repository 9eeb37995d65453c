"""Which of gRPC's I/O paths Ister's own processes use; applied before anything imports grpc.

By default grpcio (1.5x and later) does each connection's reads and writes on EventEngine threads, which
hand every completion to the grpc.aio poller thread, which wakes the event loop. Its classic path lets the
poller thread do the I/O itself: one thread hand-off fewer per message on each side of a call. On this
project's 2-vCPU machines a hand-off costs more than the Python work of a small message: the classic path
took 15-20 % less broker CPU per end-to-end message, about a tenth off the e2e p50 and a third of the
broker's context switches, with publish and consume throughput unchanged or better (docs/benchmarks.md,
"gRPC's classic I/O path").

Only the `ister` command and the benchmark tools ask for it (`prefer_classic_io` runs when `ister.cli` or
`ister.benchmark` is imported). The client library leaves an application's gRPC alone.
"""

from __future__ import annotations

import os

ENV = "GRPC_EXPERIMENTS"
# The grpcio experiments that route client, listener and other endpoints through EventEngine, turned off.
# tests/unit/test_grpc_io.py checks that the pinned grpcio still knows each name.
CLASSIC_IO = "-event_engine_client,-event_engine_listener,-event_engine_for_all_other_endpoints"


def prefer_classic_io() -> None:
    """Ask gRPC for its classic I/O path, unless the environment already says what it wants (GRPC_EXPERIMENTS
    set, even to an empty value: gRPC's defaults). gRPC reads the variable once, when it is first imported,
    so this has no effect in a process that imported grpc before; the processes it starts inherit it."""
    os.environ.setdefault(ENV, CLASSIC_IO)
