"""Calls from one broker to another's admin port for the stats RPCs: a topic's stats asked of a broker that
does not own it go to the owner, and the cluster's subscription listing gathers every broker's part.

The caller's `authorization` header travels with the call, so the other broker checks the same permission
for the same principal. One channel per admin address, kept for the process (a cluster has few brokers).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import grpc

from ister.client.transport import NO_CREDENTIALS, Credentials, open_channel
from ister.config import BrokerConfig
from ister.errors import IsterError, NotFound, Unavailable
from ister.tasks import TaskSupervisor
from ister.wire.gen import ister_v1_pb2 as pb
from ister.wire.gen import ister_v1_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

FORWARD_TIMEOUT_SECONDS = 10.0
MAX_CHANNELS = 256  # more admin addresses than that in one process: the oldest channel is dropped
FORWARDED_HEADERS = ("authorization",)


def admin_peer_credentials(config: BrokerConfig) -> Credentials:
    """How this broker reaches the others' admin ports: their CA when they serve TLS there, and this
    broker's own certificate when they require client certificates."""
    tls = config.security.tls
    admin = tls.for_port("admin")
    if admin is None:
        return NO_CREDENTIALS
    mutual = admin.client_ca_file is not None
    return Credentials(
        tls_ca=tls.peer_ca_file or admin.client_ca_file,
        cert_file=admin.cert_file if mutual else None,
        key_file=admin.key_file if mutual else None,
    )


def forwarded_metadata(context: Any) -> list[tuple[str, str]]:
    """The caller's credentials to pass on (never anything else)."""
    try:
        found = context.invocation_metadata() or ()
    except Exception:
        return []
    return [(k, v) for k, v in found if k in FORWARDED_HEADERS and isinstance(v, str)]


class PeerAdmin:
    def __init__(self, credentials: Credentials = NO_CREDENTIALS, timeout: float = FORWARD_TIMEOUT_SECONDS):
        self.credentials = credentials
        self.timeout = timeout
        self._stubs: dict[str, tuple[Any, Any]] = {}
        self._closing = TaskSupervisor("peer admin channels")  # channels evicted, closing

    def _stub(self, addr: str) -> Any:
        found = self._stubs.get(addr)
        if found is None:
            if len(self._stubs) >= MAX_CHANNELS:
                evicted = next(iter(self._stubs))
                old, _ = self._stubs.pop(evicted)
                self._closing.spawn(old.close(), f"close channel {evicted}")
            channel = open_channel(addr, self.credentials)
            found = self._stubs[addr] = (channel, pb_grpc.IsterAdminStub(channel))
        return found[1]

    async def topic_stats(
        self, broker: int, addr: str, topic: str, metadata: Sequence[tuple[str, str]]
    ) -> pb.TopicStatsResponse:
        request = pb.TopicStatsRequest(topic=topic, local=True)
        answer: pb.TopicStatsResponse = await self._call(broker, addr, "GetTopicStats", request, metadata)
        return answer

    async def subscriptions(
        self, broker: int, addr: str, namespace: str, metadata: Sequence[tuple[str, str]]
    ) -> pb.ListSubscriptionStatsResponse:
        request = pb.ListSubscriptionStatsRequest(namespace=namespace, local=True)
        answer: pb.ListSubscriptionStatsResponse = await self._call(
            broker, addr, "ListSubscriptionStats", request, metadata
        )
        return answer

    async def totals(
        self, broker: int, addr: str, namespace: str, metadata: Sequence[tuple[str, str]]
    ) -> pb.ListSubscriptionStatsResponse:
        request = pb.ListSubscriptionStatsRequest(namespace=namespace, local=True, totals_only=True)
        answer: pb.ListSubscriptionStatsResponse = await self._call(
            broker, addr, "ListSubscriptionStats", request, metadata
        )
        return answer

    async def local_copy(
        self, broker: int, addr: str, topic: str, metadata: Sequence[tuple[str, str]]
    ) -> pb.LocalCopyResponse:
        request = pb.LocalCopyRequest(topic=topic)
        answer: pb.LocalCopyResponse = await self._call(broker, addr, "DescribeLocalCopy", request, metadata)
        return answer

    async def _call(
        self, broker: int, addr: str, method: str, request: Any, metadata: Sequence[tuple[str, str]]
    ) -> Any:
        if not addr.startswith(("http://", "https://")):
            raise Unavailable(f"broker {broker} has no admin address registered")
        try:
            call = getattr(self._stub(addr), method)
            return await call(request, timeout=self.timeout, metadata=tuple(metadata))
        except grpc.aio.AioRpcError as exc:
            code, details = exc.code(), exc.details() or ""
            if code == grpc.StatusCode.NOT_FOUND:
                raise NotFound(details) from None
            raise Unavailable(
                f"broker {broker} ({addr}) did not answer {method}: {code.name}: {details}"
            ) from None
        except IsterError:
            raise
        except Exception as exc:  # a bad address, a channel that cannot open
            raise Unavailable(f"broker {broker} ({addr}) did not answer {method}: {exc}") from None
