"""Servicer of `ister.v1.IsterReplica`: followers of a replicated topic stream its leader's records here."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from ister.errors import InvalidArgument, Unavailable
from ister.ids import TopicName
from ister.replication.leader import ReplicaLeader
from ister.server.errors import bidi_stream
from ister.server.handlers import add_service
from ister.wire.gen import ister_v1_pb2 as pb
from ister.wire.gen import ister_v1_pb2_grpc as pb_grpc

LeaderLookup = Callable[[str], ReplicaLeader | None]


class ReplicaServicer(pb_grpc.IsterReplicaServicer):  # type: ignore[misc]
    def __init__(self, leaders: LeaderLookup) -> None:
        self._leaders = leaders

    @bidi_stream
    async def Replicate(
        self, requests: AsyncIterator[pb.ReplicaUp], context: Any
    ) -> AsyncIterator[pb.ReplicaFetchResponse]:
        first = await anext(requests, None)
        if first is None:
            return
        if first.WhichOneof("kind") != "open":
            raise InvalidArgument("the first ReplicaUp of a stream must be `open`")
        name = TopicName.parse(first.open.topic)  # InvalidArgument for a bad name
        leader = self._leaders(name.full)
        if leader is None:
            raise Unavailable(f"this broker does not lead {name} (now)")

        async def acks() -> AsyncIterator[int]:
            async for up in requests:
                if up.WhichOneof("kind") != "acked":
                    raise InvalidArgument("after `open`, a replica stream carries only `acked`")
                yield up.acked

        async for resp in leader.replicate(first.open, acks()):
            yield resp


def add_replica_service(server: Any, leaders: LeaderLookup) -> None:
    add_service(server, ReplicaServicer(leaders), pb, "IsterReplica")
