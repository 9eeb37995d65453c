"""A TCP proxy that holds each new connection for a while before joining it to its upstream: a server slow
to answer a new connection (long round trips, TLS's extra ones, a loaded machine), for the tests of the
channels' connection attempts (`tests/unit/test_etcd_slow_handshake.py`,
`tests/integration/test_slow_handshake.py`)."""

from __future__ import annotations

import asyncio


class SlowProxy:
    """Listens on a loopback port; each accepted connection waits `hold` seconds (nothing read or sent)
    before it is joined to `upstream_host:upstream_port`."""

    def __init__(self, upstream_port: int, hold: float, upstream_host: str = "127.0.0.1") -> None:
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.hold = hold
        self.accepted = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self, port: int = 0) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", port)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            await asyncio.sleep(self.hold)  # the slow server under test, not a wait for a condition
            up_r, up_w = await asyncio.open_connection(self.upstream_host, self.upstream_port)
        except asyncio.CancelledError:  # the test ended while this connection was held
            client_w.close()
            return
        for pipe in (_pipe(client_r, up_w), _pipe(up_r, client_w)):
            task = asyncio.create_task(pipe)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()
