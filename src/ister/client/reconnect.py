"""The reconnect loop shared by the client's streams (a publisher's Publish, a subscriber's Consume).

A session looks the topic up (`Client.route`, which follows a lookup redirect to the owner), opens the
stream with `_open` (the open frame written and answered within connect_timeout) and runs until the stream
fails. `ReconnectingStream._run` runs sessions until the stream is closing: after a retriable failure it
waits the next backoff of one `RetryBudget` (the client's retry policy: retry_timeout, max_retries,
exponential backoff with jitter) and starts a new session; a session that made progress resets the budget
first, so that a stream that worked for a while starts a fresh series of retries. A non-retriable failure,
or a spent budget, goes to the stream's own handler (a publisher fails the pending batches and waits for
new ones; a subscriber fails for good and closes), and the budget starts afresh.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

import grpc

from ister import errors
from ister.client._conn import RetryBudget
from ister.client.errors import exhausted, to_ister_error
from ister.client.streams import raise_call_status

if TYPE_CHECKING:
    from ister.client.client import Client

log = logging.getLogger(__name__)


class ReconnectingStream(ABC):
    """A stream to one topic that reconnects: subclasses give one session and the failure handlers."""

    client: Client
    topic: str
    _closing: bool

    async def _run(self) -> None:
        """Run sessions until the stream is closing (see the module docstring)."""
        budget = RetryBudget(self.client.retry)
        while not self._closing:
            try:
                await self._session()
                return  # closing
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                err = to_ister_error(exc)
            if self._closing:
                return
            if not err.retriable:
                await self._rejected(err)
                budget.reset()
                continue
            if self._progressed():
                budget.reset()  # the stream made progress (or had nothing to lose): a fresh failure
            delay = budget.next_delay()
            if delay is None:
                await self._exhausted(exhausted(err, budget, self._activity()))
                budget.reset()
                continue
            log.info(
                "%s: %s (%s); retry %d in %.2f s", self.topic, self._failure(), err, budget.attempts, delay
            )
            await asyncio.sleep(delay)

    async def _open(self, call: Any, request: Any, url: str, kind: str, open_name: str) -> Any:
        """Write the stream's open frame and read the answer within connect_timeout; the answer's `opened`.

        Raises the broker's status as a typed error when it refuses the stream, and Unavailable when no
        answer comes in time (an owner that died is then looked up again instead of waited for)."""
        timeout = self.client.connect_timeout
        try:
            async with asyncio.timeout(timeout):
                try:
                    await call.write(request)
                except grpc.aio.AioRpcError:
                    raise
                except Exception:
                    await raise_call_status(call, f"opening the {kind} stream on {url} failed")
                resp = await call.read()
        except TimeoutError:
            raise errors.Unavailable(
                f"{self.topic}: no answer to {open_name} from {url} within {timeout:g} s"
            ) from None
        if resp is grpc.aio.EOF or resp.WhichOneof("kind") != "opened":
            await raise_call_status(call, f"the broker did not answer {open_name}")
        return resp.opened

    @abstractmethod
    async def _session(self) -> None:
        """Look the topic up, open the stream and run it; returns only when the stream is closing."""

    @abstractmethod
    def _progressed(self) -> bool:
        """Whether the failed session made progress (the retry budget then starts afresh)."""

    @abstractmethod
    async def _rejected(self, err: errors.IsterError) -> None:
        """Handle a non-retriable failure (set `_closing` to stop reconnecting)."""

    @abstractmethod
    async def _exhausted(self, err: errors.IsterError) -> None:
        """Handle a spent retry budget; `err` says what was tried, how often and for how long."""

    @abstractmethod
    def _activity(self) -> str:
        """What the stream does, for the error that ends a series of retries ("<topic>: publishing")."""

    @abstractmethod
    def _failure(self) -> str:
        """How the last session failed, for the retry log line ("publish stream failed in open")."""
