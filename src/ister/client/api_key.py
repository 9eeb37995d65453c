"""A client's API key, exchanged for short-lived tokens (`Ister.ExchangeApiKey`) and refreshed before they
expire.

The session is a gRPC metadata plugin: every call carries the current token, read when the call starts, so
a refresh applies to every channel at once without reconnecting. `Client.connect()` makes the first
exchange (Unauthenticated at once for a wrong or revoked key); a background task then exchanges again when
three quarters of the token's lifetime have passed, retrying a failed exchange with backoff until the token
expires. The key and tokens are never logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from ister.client.errors import to_ister_error
from ister.core.backoff import Backoff, Retries
from ister.errors import IsterError
from ister.wire.gen import ister_v1_pb2 as pb

log = logging.getLogger(__name__)

API_KEY_ENV = "ISTER_API_KEY"
REFRESH_FRACTION = 0.75  # of a token's lifetime, when the next exchange starts
MIN_REFRESH_SECONDS = 0.5
EXCHANGE_TIMEOUT_SECONDS = 10.0
RETRY_SECONDS = (0.2, 2.0)  # first and longest wait between failed refreshes
RETRY_BACKOFF = Backoff(first=RETRY_SECONDS[0], cap=RETRY_SECONDS[1])


class ApiKeySession:
    def __init__(self, api_key: str) -> None:
        self._api_key = api_key
        self.token: str | None = None
        self.principal = ""
        self.obtained_at = 0.0  # wall clock
        self.expires_at = 0.0  # wall clock, the token's exp
        self.exchanges = 0
        self._task: asyncio.Task[None] | None = None

    def __repr__(self) -> str:  # never shows the key or the token
        return f"ApiKeySession(principal={self.principal!r}, expires_at={self.expires_at:.0f})"

    # -- grpc.AuthMetadataPlugin -----------------------------------------------------------------------
    def __call__(self, context: Any, callback: Any) -> None:
        token = self.token
        callback((("authorization", f"Bearer {token}"),) if token else (), None)

    # -- exchanging ----------------------------------------------------------------------------------------
    async def exchange(self, stub: Any) -> None:
        """One exchange on `stub` (an IsterStub); raises the client's IsterError on failure."""
        try:
            resp = await stub.ExchangeApiKey(
                pb.ExchangeApiKeyRequest(api_key=self._api_key), timeout=EXCHANGE_TIMEOUT_SECONDS
            )
        except Exception as exc:
            raise to_ister_error(exc) from None
        self.token = resp.token
        self.principal = resp.principal
        self.obtained_at = time.time()
        self.expires_at = resp.expires_at_ms / 1000
        self.exchanges += 1

    def refresh_in(self) -> float:
        """Seconds until the next exchange should start."""
        lifetime = max(0.0, self.expires_at - self.obtained_at)
        return max(MIN_REFRESH_SECONDS, self.obtained_at + lifetime * REFRESH_FRACTION - time.time())

    def start(self, stub_of: Any) -> None:
        """Keep the token fresh in the background; `stub_of()` gives the stub to ask (the current seed)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._refresh(stub_of), name="api-key-refresh"
            )

    async def _refresh(self, stub_of: Any) -> None:
        while True:
            await asyncio.sleep(self.refresh_in())  # a deadline, not a condition: the token's age
            retries = Retries(RETRY_BACKOFF)
            while True:
                try:
                    await self.exchange(stub_of())
                    break
                except IsterError as exc:
                    left = self.expires_at - time.time()
                    log.warning(
                        "API key exchange for %s failed (token expires in %.0f s), retrying: %s",
                        self.principal or "the client",
                        left,
                        type(exc).__name__,
                    )
                    await asyncio.sleep(retries.next())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
