"""An etcd that is slow to start its HTTP/2 session (a loaded machine, a slow TLS link) is still reached.

gRPC gives each connection attempt max(backoff, min connect timeout) to finish its handshake; the
channel's `grpc.min_reconnect_backoff_ms` *is* that minimum. At 100 ms every attempt to an etcd that
answered its SETTINGS frame later than the backoff (at most 1 s) was cut off, again and again, until the
request's deadline: seen once at load 20 as "connection attempt timed out before receiving SETTINGS frame"
on a freshly started etcd. A proxy that holds each new connection before passing bytes shows it.
"""

from __future__ import annotations

from ister.metadata.etcd import EtcdStore
from tests.etcd_server import EtcdServer
from tests.slow_proxy import SlowProxy

HOLD_SECONDS = 1.5  # longer than the channel's 1 s maximum backoff, shorter than its connect timeout


async def test_an_etcd_slow_to_answer_a_new_connection_is_reached(etcd_server: EtcdServer) -> None:
    host, port = etcd_server.endpoint.rsplit(":", 1)
    proxy = SlowProxy(int(port), HOLD_SECONDS, upstream_host=host)
    await proxy.start()
    try:
        store = await EtcdStore.connect([f"127.0.0.1:{proxy.port}"], namespace="/slowhs", timeout=8.0)
        try:
            rev = await store.put("/k", "v")
            assert rev > 0
            got = await store.get("/k")
            assert got is not None and got.value == "v"
        finally:
            await store.close()
        assert proxy.accepted, "the proxy saw no connection"
    finally:
        await proxy.close()
