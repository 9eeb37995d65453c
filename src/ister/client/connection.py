"""The Ister client's connection: channels per broker URL, the seeds for lookups, routing a call to a
topic's owner and retrying it (`Client` in client.py builds producers, consumers and reads on it)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self, TypeVar

import grpc

from ister import errors
from ister.client._conn import RetryBudget, RetryPolicy, normalize_url
from ister.client.api_key import API_KEY_ENV, ApiKeySession
from ister.client.dictionaries import Dictionaries
from ister.client.errors import exhausted, to_ister_error
from ister.client.schemas import SchemaRegistry
from ister.client.transport import TLS_CA_ENV, TOKEN_ENV, Credentials, open_channel
from ister.wire.gen import ister_v1_pb2 as pb
from ister.wire.gen import ister_v1_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from ister.client.consumer import Consumer
    from ister.client.producer import Producer

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class TopicLookup:
    partitions: list[str]
    broker_url: str


class _Refused(Exception):
    """A connection attempt failed (refused, unreachable, a failed TLS handshake)."""


class ClientConnection:
    """Channels, seeds, lookups and retries: the part of `Client` that reaches brokers (see `Client`)."""

    def __init__(
        self,
        url: str | Sequence[str] = "http://127.0.0.1:6650",
        *,
        connect_timeout: float = 10.0,
        max_retries: int | None = None,
        backoff_base: float = 0.2,
        backoff_max: float = 2.0,
        retry_timeout: float = 30.0,
        token: str | None = None,
        tls_ca: str | None = None,
        api_key: str | None = None,
        wait_for_broker: bool = True,
    ) -> None:
        raw = url.split(",") if isinstance(url, str) else list(url)
        # Seeds: any broker answers lookups, so one that is down just means asking the next one.
        self.urls = list(dict.fromkeys(normalize_url(u) for u in raw if u.strip()))
        if not self.urls:
            raise errors.InvalidArgument("the client needs at least one service URL")
        if connect_timeout <= 0 or retry_timeout < 0 or (max_retries is not None and max_retries < 0):
            raise errors.InvalidArgument("connect_timeout must be > 0, retry_timeout and max_retries >= 0")
        self._seed = 0
        # Unset: from the environment, as every `ister` command and the Spark connector pass them on.
        # An explicit token, else an explicit API key, else ISTER_TOKEN, else ISTER_API_KEY.
        if not token and not api_key:
            token = os.environ.get(TOKEN_ENV) or None
            api_key = None if token else os.environ.get(API_KEY_ENV) or None
        self.api_key_session = ApiKeySession(api_key) if api_key and not token else None
        self.credentials = Credentials(
            token=token or None,
            tls_ca=tls_ca or os.environ.get(TLS_CA_ENV) or None,
            session=self.api_key_session,
        )
        self.connect_timeout = connect_timeout
        self.wait_for_broker = wait_for_broker
        self.retry = RetryPolicy(max_retries, backoff_base, backoff_max, retry_timeout)
        self._channels: dict[str, Any] = {}
        self._stubs: dict[str, Any] = {}
        self._owned: set[Producer | Consumer] = set()
        self._closed = False
        self.schemas = SchemaRegistry(self)
        self.dictionaries = Dictionaries(self)  # zstd dictionaries fetched on demand

    # -- connection -----------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """The service URL (seed) in use for lookups."""
        return self.urls[self._seed]

    @property
    def _seed_timeout(self) -> float:
        """One seed's share of connect_timeout (at least a second), so a dead seed does not use it all."""
        return max(1.0, self.connect_timeout / len(self.urls)) if len(self.urls) > 1 else self.connect_timeout

    def _answers(self, url: str) -> bool:
        """Whether the channel to `url` is connected (a broker that answered UNAVAILABLE, e.g. while a
        topic is reassigned, is still the seed to ask: only an unreachable one is skipped)."""
        channel = self._channels.get(url)
        try:
            return channel is not None and channel.get_state() == grpc.ChannelConnectivity.READY
        except Exception:
            return False

    def _next_seed(self) -> None:
        self._seed = (self._seed + 1) % len(self.urls)

    async def connect(self) -> Self:
        """Wait until a service URL accepts a connection, trying each seed in turn (Unavailable when none
        does within its share of connect_timeout)."""
        refused: list[str] = []
        for _ in self.urls:
            try:
                async with asyncio.timeout(self._seed_timeout):
                    await self._until_connected(self._channel(self.url))
                await self._first_exchange()
                return self
            except TimeoutError:
                self._next_seed()
            except _Refused:
                refused.append(self.url)
                self._next_seed()
        if refused and len(refused) == len(self.urls):
            raise errors.Unavailable(
                f"cannot connect to {', '.join(refused)}: connection refused or failed "
                f"(is a broker listening there?)"
            ) from None
        raise errors.Unavailable(
            f"cannot connect to {', '.join(self.urls)} within {self.connect_timeout} s"
        ) from None

    async def _until_connected(self, channel: Any) -> None:
        """Return once the channel is connected; _Refused at its first failed attempt when the client
        does not wait for brokers (else gRPC keeps trying, and the caller's timeout bounds the wait)."""
        state = channel.get_state(try_to_connect=True)
        while state != grpc.ChannelConnectivity.READY:
            if state == grpc.ChannelConnectivity.TRANSIENT_FAILURE and not self.wait_for_broker:
                raise _Refused
            await channel.wait_for_state_change(state)
            state = channel.get_state(try_to_connect=True)

    async def _first_exchange(self) -> None:
        """With an API key: the first token (Unauthenticated at once for a wrong or revoked key), then
        refreshed in the background before it expires."""
        session = self.api_key_session
        if session is None or session.token is not None:
            return
        await session.exchange(self.stub())
        session.start(self.stub)

    async def __aenter__(self) -> Self:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _channel(self, url: str) -> Any:
        if self._closed:
            raise errors.FailedPrecondition("the client is closed")
        channel = self._channels.get(url)
        if channel is None:
            channel = self._channels[url] = open_channel(url, self.credentials)
            self._stubs[url] = pb_grpc.IsterStub(channel)
        return channel

    def stub(self, url: str | None = None) -> Any:
        url = normalize_url(url) if url else self.url
        self._channel(url)
        return self._stubs[url]

    async def close(self) -> None:
        """Close every producer (flushing) and consumer of this client, then the channels."""
        if self._closed:
            return
        for owned in list(self._owned):
            with contextlib.suppress(Exception):
                await owned.close()
        self._closed = True
        if self.api_key_session is not None:
            await self.api_key_session.stop()
        for channel in self._channels.values():
            with contextlib.suppress(Exception):
                await channel.close()
        self._channels.clear()
        self._stubs.clear()

    def _forget(self, owned: Producer | Consumer) -> None:
        self._owned.discard(owned)

    # -- lookup ---------------------------------------------------------------------------------------------
    async def lookup(self, topic: str) -> TopicLookup:
        """Partitions and serving broker of a topic (one attempt; NotFound for an unknown topic)."""
        seed = self.url
        if len(self.urls) == 1 or self._answers(seed):
            return await self._lookup_at(seed, topic)
        # Not connected to the seed: a new connection may take its whole attempt (transport.py's 5 s) when
        # the broker is paused or slow to answer, so the next seed is asked too and the first answer wins.
        other = self.urls[(self._seed + 1) % len(self.urls)]
        asks = {
            asyncio.create_task(self._lookup_at(seed, topic)): seed,
            asyncio.create_task(self._lookup_at(other, topic, moves_on=False)): other,
        }
        try:
            pending = set(asks)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    exc = task.exception()
                    if exc is None or isinstance(exc, errors.NotFound):
                        if asks[task] == other and self.url == seed:
                            self._seed = self.urls.index(other)  # the one that answered is kept
                        return task.result()
            primary = next(t for t, url in asks.items() if url == seed)
            return primary.result()  # both failed: the seed's own error, as without the second ask
        finally:
            for task in asks:
                task.cancel()
            await asyncio.gather(*asks, return_exceptions=True)

    async def _lookup_at(self, seed: str, topic: str, moves_on: bool = True) -> TopicLookup:
        """A lookup on `seed`; when it fails in a way that says to ask elsewhere, and `moves_on`, the next
        seed becomes the one asked."""
        try:
            # With several seeds, one that refuses connections fails at once and the retry asks the next
            # (one that does not answer at all is skipped after its share of connect_timeout). A single
            # seed is waited for (up to connect_timeout): it may be restarting, and there is no other.
            resp = await self.stub(seed).Lookup(
                pb.LookupRequest(topic=topic), timeout=self._seed_timeout, wait_for_ready=len(self.urls) == 1
            )
        except Exception as exc:
            err = to_ister_error(exc)
            silent = isinstance(err, errors.Timeout)
            if silent:
                err = errors.Unavailable(f"no answer from {seed} within {self._seed_timeout:g} s")
            elif type(err) is errors.Unavailable and seed not in str(err):
                err = errors.Unavailable(f"lookup on {seed}: {err}")
            stale = isinstance(err, errors.AskAnother)  # the seed cannot know who serves the topic now
            if (
                moves_on
                and err.retriable
                and seed == self.url
                and (silent or stale or not self._answers(seed))
            ):
                self._next_seed()  # the retry asks the next seed
            raise err from None
        return TopicLookup(list(resp.partitions), resp.broker_url)

    async def lookup_with_retry(self, topic: str) -> TopicLookup | None:
        """`lookup` retried on retriable errors (within the retry budget); None when the topic does not
        exist."""
        budget = RetryBudget(self.retry)
        while True:
            try:
                return await self.lookup(topic)
            except errors.NotFound:
                return None
            except errors.IsterError as err:
                await self._retry_or_raise(err, budget, f"{topic}: lookup")

    async def route(self, topic: str) -> tuple[str, Any]:
        """(URL, stub) of the broker serving `topic` (the service URL while it does not exist yet)."""
        try:
            found = await self.lookup(topic)
        except errors.NotFound:
            return self.url, self.stub()
        url = normalize_url(found.broker_url) if found.broker_url else self.url
        return url, self.stub(url)

    async def stub_for(self, topic: str) -> Any:
        """The stub of the broker serving `topic` (the service URL while it does not exist yet)."""
        return (await self.route(topic))[1]

    async def _retry_or_raise(self, exc: BaseException, budget: RetryBudget, what: str) -> None:
        """Wait before the next retry of a retriable failure; raise the typed error when it is not
        retriable or the budget is spent (then naming `what` and how long it was tried)."""
        err = to_ister_error(exc)
        if not err.retriable:
            raise err from None
        delay = budget.next_delay()
        if delay is None:
            raise exhausted(err, budget, what) from None
        await asyncio.sleep(delay)

    async def _on_owner(self, topic: str, call: Callable[[Any], Awaitable[T]], what: str) -> T:
        """`call(stub of the topic's owner)`, looking the topic up again and retrying retriable errors."""
        budget = RetryBudget(self.retry)
        while True:
            try:
                return await call(await self.stub_for(topic))
            except Exception as exc:
                await self._retry_or_raise(exc, budget, f"{topic}: {what}")
