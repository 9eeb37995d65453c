"""An etcd that is slow to start its HTTP/2 session (a loaded machine, a slow TLS link) is still reached.

gRPC gives each connection attempt max(backoff, min connect timeout) to finish its handshake; the
channel's `grpc.min_reconnect_backoff_ms` *is* that minimum. At 100 ms every attempt to an etcd that
answered its SETTINGS frame later than the backoff (at most 1 s) was cut off, again and again, until the
request's deadline: seen once at load 20 as "connection attempt timed out before receiving SETTINGS frame"
on a freshly started etcd. A proxy that holds each new connection before passing bytes shows it.
"""

from __future__ import annotations

import asyncio
import contextlib

from ister.metadata.etcd import EtcdStore
from tests.etcd_server import EtcdServer

HOLD_SECONDS = 1.5  # longer than the channel's 1 s maximum backoff, shorter than its connect timeout


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def test_an_etcd_slow_to_answer_a_new_connection_is_reached(etcd_server: EtcdServer) -> None:
    host, port = etcd_server.endpoint.rsplit(":", 1)
    held: list[float] = []
    tasks: set[asyncio.Task[None]] = set()

    async def serve(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        held.append(HOLD_SECONDS)
        await asyncio.sleep(HOLD_SECONDS)  # the slow server under test: nothing is read or sent meanwhile
        up_r, up_w = await asyncio.open_connection(host, int(port))
        for t in (asyncio.create_task(_pipe(client_r, up_w)), asyncio.create_task(_pipe(up_r, client_w))):
            tasks.add(t)

    proxy = await asyncio.start_server(serve, "127.0.0.1", 0)
    proxy_port = proxy.sockets[0].getsockname()[1]
    try:
        store = await EtcdStore.connect([f"127.0.0.1:{proxy_port}"], namespace="/slowhs", timeout=8.0)
        try:
            rev = await store.put("/k", "v")
            assert rev > 0
            got = await store.get("/k")
            assert got is not None and got.value == "v"
        finally:
            await store.close()
        assert held, "the proxy saw no connection"
    finally:
        proxy.close()
        for t in tasks:
            t.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*tasks, return_exceptions=True)
