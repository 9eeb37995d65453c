"""Servicer of `ister.v1.IsterReplica`: followers of a replicated topic fetch its leader's records here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ister.errors import Unavailable
from ister.ids import TopicName
from ister.replication.leader import ReplicaLeader
from ister.server.errors import unary
from ister.server.handlers import add_service
from ister.wire.gen import ister_v1_pb2 as pb
from ister.wire.gen import ister_v1_pb2_grpc as pb_grpc

LeaderLookup = Callable[[str], ReplicaLeader | None]


class ReplicaServicer(pb_grpc.IsterReplicaServicer):  # type: ignore[misc]
    def __init__(self, leaders: LeaderLookup) -> None:
        self._leaders = leaders

    @unary
    async def Fetch(self, request: pb.ReplicaFetchRequest, context: Any) -> pb.ReplicaFetchResponse:
        name = TopicName.parse(request.topic)  # InvalidArgument for a bad name
        leader = self._leaders(name.full)
        if leader is None:
            raise Unavailable(f"this broker does not lead {name} (now)")
        return await leader.fetch(request)


def add_replica_service(server: Any, leaders: LeaderLookup) -> None:
    add_service(server, ReplicaServicer(leaders), pb, "IsterReplica")
