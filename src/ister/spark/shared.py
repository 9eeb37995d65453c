"""One Ister client per Spark Python worker process, kept across tasks.

Spark reuses its Python workers (`spark.python.worker.reuse`, on by default), so a client made per task
would pay a connection and lookups every time. As Kafka's connector caches its producers per executor,
tasks here share the worker's client; it lives until the worker exits.
"""

from __future__ import annotations

import atexit
import os
import threading

from ister.client.blocking import BlockingClient
from ister.spark.options import DEFAULT_CONNECT_TIMEOUT, ClientAuth

_clients: dict[tuple[int, str, float, ClientAuth], BlockingClient] = {}
_lock = threading.Lock()


def shared_client(
    url: str, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT, auth: ClientAuth | None = None
) -> BlockingClient:
    """This process's client for `url` and credentials (a forked child makes its own)."""
    auth = auth or ClientAuth()
    key = (os.getpid(), url, connect_timeout, auth)
    with _lock:
        client = _clients.get(key)
        if client is None or client.closed:
            if not _clients:
                atexit.register(close_all)
            client = _clients[key] = BlockingClient(
                url, connect_timeout=connect_timeout, token=auth.token, tls_ca=auth.tls_ca
            )
        return client


def close_all() -> None:
    with _lock:
        mine = [c for (pid, *_), c in _clients.items() if pid == os.getpid()]
        _clients.clear()
    for client in mine:
        client.close()
