"""The console's one source of truth: the broker's admin gRPC API (async channel, TLS and token as the
CLI sets them). Topic pages are the broker's (IsterAdmin.ListTopics: filtered, sorted and paged there);
the overview's topic counts are kept briefly, so the live overview costs the broker little at any count."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import grpc

from ister.cli.security_opts import current
from ister.console.health import Health, health
from ister.console.paging import Page, TopicRow, check, pages_of
from ister.console.rates import Rates, rates
from ister.wire.gen import DanubeAdmin_pb2 as pb
from ister.wire.gen import DanubeAdmin_pb2_grpc as pb_grpc
from ister.wire.gen import SchemaRegistry_pb2_grpc as schema_grpc
from ister.wire.gen import ister_v1_pb2 as ister_pb
from ister.wire.gen import ister_v1_pb2_grpc as ister_pb_grpc

CALL_TIMEOUT_SECONDS = 5.0
COUNTS_CACHE_SECONDS = 3.0
# The broker counts from its name and owner indexes (O(namespaces) at any topic count since issue 42), and
# each open overview asks every 2 s: the counts are kept at least 10 times as long as they took, so a
# broker slow to answer (loaded, or an older one that lists every topic) gets at most a tenth of its time.
LIST_SHARE = 0.1
RESET_TIMEOUT_SECONDS = 60.0
CHANNEL_OPTIONS = [
    # A restarted broker is seen within 2 s: gRPC's default reconnect backoff grows to 120 s while it is down.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]
MANAGE_CACHE_SECONDS = 60.0


@dataclass(frozen=True)
class Broker:
    broker_id: str
    addr: str
    role: str
    status: str
    leader: bool
    topics: int

    @property
    def bad(self) -> bool:
        """A state an operator should look at (anything but active)."""
        return self.status.lower() != "active"


@dataclass(frozen=True)
class TopicCounts:
    total: int
    per_broker: dict[str, int]  # broker id (decimal) -> topics it owns
    namespaces: int | None = None  # None: not counted (a token that may not list topics)


@dataclass
class Overview:
    reachable: bool
    error: str = ""
    brokers: list[Broker] = field(default_factory=list)
    topics: int | None = 0  # None: the token may not list them (`denied` says why)
    namespaces: int = 0
    denied: str = ""
    rates: Rates | None = None
    may_manage: bool = False  # drain/activate buttons: the broker said this token may (a dry-run drain)
    health: Health | None = None  # moves, failed moves, under-replicated and under-min-ISR topics


class AdminSource:
    def __init__(self, target: str, tls: bool = False) -> None:
        self.target = target
        self._tls = tls
        self._channel: Any = None
        self._counts_cache: tuple[float, TopicCounts] | None = None
        self._cache_seconds = COUNTS_CACHE_SECONDS
        self._lock = asyncio.Lock()
        self._manage_cache: tuple[float, bool] | None = None

    async def open(self) -> None:
        """Make the channel on the server's event loop (an aio channel belongs to the loop it was made on)."""
        creds = current()
        if self._tls or creds.tls:
            self._channel = grpc.aio.secure_channel(
                self.target, creds.channel_credentials(), options=CHANNEL_OPTIONS
            )
        else:
            self._channel = grpc.aio.insecure_channel(self.target, options=CHANNEL_OPTIONS)
        self._brokers = pb_grpc.BrokerAdminStub(self._channel)
        self._topic_admin = pb_grpc.TopicAdminStub(self._channel)
        self._ister_admin = ister_pb_grpc.IsterAdminStub(self._channel)
        self.schemas = schema_grpc.SchemaRegistryStub(self._channel)
        self.security = pb_grpc.SecurityAdminStub(self._channel)

    @property
    def brokers(self) -> Any:
        """BrokerAdmin: drain, activate, balance, rebalance (the pages call it directly)."""
        return self._brokers

    @property
    def ister_admin(self) -> Any:
        return self._ister_admin

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()

    async def topic_page(self, query: str, sort: str, desc: bool, page: int, size: int) -> Page:
        """One page of the topics whose name contains `query`, as the broker sorts and pages them; a page
        past the end is the last one. ValueError for bad paging input (nothing is asked)."""
        check(sort, page, size)

        async def ask(number: int) -> Any:
            request = ister_pb.ListTopicsRequest(
                name_filter=query.strip(), sort=sort, descending=desc, offset=(number - 1) * size, limit=size
            )
            return await self._ister_admin.ListTopics(request, timeout=CALL_TIMEOUT_SECONDS)

        answer = await ask(page)
        pages = pages_of(answer.matched, size)
        if page > pages:
            page = pages
            answer = await ask(page)
        rows = [
            TopicRow(t.name, str(t.broker_id) if t.HasField("broker_id") else "", t.delivery)
            for t in answer.topics
        ]
        return Page(rows, answer.matched, page, pages)

    async def topic_counts(self) -> TopicCounts:
        """Every topic counted, and per owner (ListTopics with no page); kept COUNTS_CACHE_SECONDS, or
        longer when counting is slow."""
        async with self._lock:
            cached = self._counts_cache
            if cached is not None and time.monotonic() - cached[0] < self._cache_seconds:
                return cached[1]
            started = time.monotonic()
            answer = await self._ister_admin.ListTopics(
                ister_pb.ListTopicsRequest(limit=0), timeout=CALL_TIMEOUT_SECONDS
            )
            per_broker = {str(b): n for b, n in answer.per_broker.items()}
            counts = TopicCounts(answer.total, per_broker, answer.namespaces)
            now = time.monotonic()
            self._counts_cache = (now, counts)
            self._cache_seconds = max(COUNTS_CACHE_SECONDS, (now - started) / LIST_SHARE)
            return counts

    async def overview(self) -> Overview:
        """Brokers, the leader and totals; `reachable=False` with the reason when the API does not answer."""
        try:
            listed = await self._brokers.ListBrokers(pb.Empty(), timeout=CALL_TIMEOUT_SECONDS)
            leader = await self._brokers.GetLeaderBroker(pb.Empty(), timeout=CALL_TIMEOUT_SECONDS)
            denied = ""
            try:
                counts = await self.topic_counts()
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.PERMISSION_DENIED:
                    raise
                counts, denied = TopicCounts(0, {}), f"this token may not list topics: {exc.details()}"
            namespaces = counts.namespaces
            if namespaces is None:  # the count comes with the topics' (one listing at any topic count)
                ns = await self._brokers.ListNamespaces(pb.Empty(), timeout=CALL_TIMEOUT_SECONDS)
                namespaces = len(ns.namespaces)
            cluster_rates = await rates(self._brokers, self._ister_admin)
            cluster_health = await health(self._ister_admin)
            may_manage = await self.may_manage([b.broker_id for b in listed.brokers])
        except grpc.RpcError as exc:
            code = exc.code().name if hasattr(exc, "code") else "UNKNOWN"
            details = exc.details() if hasattr(exc, "details") else str(exc)
            return Overview(False, f"{details} ({code})")
        brokers = [
            Broker(
                b.broker_id,
                b.broker_addr,
                b.broker_role,
                b.broker_status,
                b.broker_id == leader.leader,
                counts.per_broker.get(b.broker_id, 0),
            )
            for b in listed.brokers
        ]
        topics = None if denied else counts.total
        return Overview(
            True, "", brokers, topics, namespaces, denied, cluster_rates, may_manage, cluster_health
        )

    async def may_manage(self, broker_ids: list[str]) -> bool:
        """Whether the token may drain and activate brokers: a dry-run drain asks RBAC (the same rule,
        cluster-wide) and moves nothing. Asked once a minute, not on every refresh."""
        if len(broker_ids) < 2:
            return False  # a drain needs another active broker: no buttons on a standalone broker
        cached = self._manage_cache
        if cached is not None and time.monotonic() - cached[0] < MANAGE_CACHE_SECONDS:
            return cached[1]
        try:
            await self._brokers.UnloadBroker(
                pb.UnloadBrokerRequest(broker_id=broker_ids[0], dry_run=True), timeout=CALL_TIMEOUT_SECONDS
            )
            allowed = True
        except grpc.RpcError as exc:
            if exc.code() not in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
                raise
            allowed = False
        self._manage_cache = (time.monotonic(), allowed)
        return allowed

    async def topic(self, name: str) -> tuple[Any, Any]:
        """A topic's description (schema, replicas) and live stats from its owner; grpc.RpcError if not."""
        described = await self._topic_admin.DescribeTopic(
            pb.DescribeTopicRequest(name=name), timeout=CALL_TIMEOUT_SECONDS
        )
        stats = await self._ister_admin.GetTopicStats(
            ister_pb.TopicStatsRequest(topic=name), timeout=CALL_TIMEOUT_SECONDS
        )
        return described, stats

    async def subscriptions(self, namespace: str = "") -> Any:
        """Every subscription of the cluster, most lagging first (the broker sorts)."""
        return await self._ister_admin.ListSubscriptionStats(
            ister_pb.ListSubscriptionStatsRequest(namespace=namespace), timeout=CALL_TIMEOUT_SECONDS
        )

    async def reset_cursor(self, request: ister_pb.ResetCursorRequest) -> Any:
        """IsterAdmin.ResetCursor as the CLI calls it (dry_run: where it would go, nothing moves)."""
        return await self._ister_admin.ResetCursor(request, timeout=RESET_TIMEOUT_SECONDS)

    async def may_reset(self, topic: str, subscription: str) -> bool:
        """Whether the token may move this topic's cursors: a dry run asks RBAC and moves nothing."""
        request = ister_pb.ResetCursorRequest(
            topic=topic, subscription=subscription, latest=True, dry_run=True
        )
        try:
            await self.reset_cursor(request)
        except grpc.RpcError as exc:
            if exc.code() in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
                return False
            raise
        return True

    async def peek(self, topic: str, start: int | None, count: int) -> Any:
        """IsterAdmin.PeekMessages: records from `start` (None: the earliest), decoded by their schema;
        no subscription, no cursor moves."""
        request = ister_pb.PeekMessagesRequest(topic=topic, count=count)
        if start is not None:
            request.offset = start
        return await self._ister_admin.PeekMessages(request, timeout=RESET_TIMEOUT_SECONDS)
