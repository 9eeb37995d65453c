"""A Danube-protocol gRPC server that stores nothing and answers at once: the ceiling of the protocol itself.

The danube-client cases run the same workloads against it to show how much of a figure is gRPC and client
cost: publishes are answered and dropped; a consumer's stream carries made-up 100-byte messages as fast as
the client takes them, holding at most WINDOW sent and not yet acknowledged (0: no limit), and acks only
open that window. It imports the generated Danube stubs, so it always runs as its own process (the official
danube-client registers the same proto package in whatever process imports it):

    python -m ister.benchmark.noop_server PORT [WINDOW]
"""

from __future__ import annotations

import asyncio
import itertools
import sys
from typing import Any

import grpc
import uvloop

from ister.wire.gen import DanubeApi_pb2 as pb
from ister.wire.gen import DanubeApi_pb2_grpc as pb_grpc

_url = ""
PAYLOAD = b"x" * 100


class Consumer(pb_grpc.ConsumerServiceServicer):  # type: ignore[misc]
    """Every consumer gets its own endless stream; acks free room in its window, nothing else."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.ids = itertools.count(1)
        self.room: dict[int, asyncio.Semaphore] = {}
        self.subscription: dict[int, tuple[str, str]] = {}

    async def Subscribe(self, request: Any, context: Any) -> Any:
        cid = next(self.ids)
        self.room[cid] = asyncio.Semaphore(self.window)
        self.subscription[cid] = (request.topic_name, request.subscription)
        return pb.ConsumerResponse(
            request_id=request.request_id, consumer_id=cid, consumer_name=request.consumer_name
        )

    async def ReceiveMessages(self, request: Any, context: Any) -> Any:
        cid = request.consumer_id
        topic, subscription = self.subscription.get(cid, ("", ""))
        room = self.room.get(cid)
        for offset in itertools.count():
            if room is not None and self.window > 0:
                await room.acquire()
            yield pb.StreamMessage(
                request_id=offset,
                msg_id=pb.MsgID(producer_id=1, topic_name=topic, broker_addr=_url, topic_offset=offset),
                payload=PAYLOAD,
                publish_time=0,
                producer_name="noop",
                subscription_name=subscription,
            )

    async def Ack(self, request: Any, context: Any) -> Any:
        if self.window > 0:
            for room in self.room.values():  # one consumer per server in the bench
                room.release()
        return pb.AckResponse(request_id=request.request_id)

    async def Nack(self, request: Any, context: Any) -> Any:
        return pb.NackResponse(request_id=request.request_id)


class Producer(pb_grpc.ProducerServiceServicer):  # type: ignore[misc]
    async def CreateProducer(self, request: Any, context: Any) -> Any:
        return pb.ProducerResponse(
            request_id=request.request_id, producer_id=1, producer_name=request.producer_name
        )

    async def SendMessage(self, request: Any, context: Any) -> Any:
        return pb.MessageResponse(request_id=request.request_id)


class Discovery(pb_grpc.DiscoveryServicer):  # type: ignore[misc]
    async def TopicLookup(self, request: Any, context: Any) -> Any:
        return pb.TopicLookupResponse(
            request_id=request.request_id,
            response_type=pb.TopicLookupResponse.Connect,
            connect_url=_url,
            broker_url=_url,
        )

    async def TopicPartitions(self, request: Any, context: Any) -> Any:
        return pb.TopicPartitionsResponse(request_id=request.request_id, partitions=[request.topic])


class Health(pb_grpc.HealthCheckServicer):  # type: ignore[misc]
    async def HealthCheck(self, request: Any, context: Any) -> Any:
        return pb.HealthCheckResponse(status=pb.HealthCheckResponse.OK)


async def serve(port: int, window: int) -> None:
    global _url
    _url = f"http://127.0.0.1:{port}"
    server = grpc.aio.server()
    pb_grpc.add_ProducerServiceServicer_to_server(Producer(), server)
    pb_grpc.add_ConsumerServiceServicer_to_server(Consumer(window), server)
    pb_grpc.add_DiscoveryServicer_to_server(Discovery(), server)
    pb_grpc.add_HealthCheckServicer_to_server(Health(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not 1 <= len(args) <= 2 or not all(a.isdigit() for a in args):
        raise SystemExit("usage: python -m ister.benchmark.noop_server PORT [WINDOW]")
    uvloop.run(serve(int(args[0]), int(args[1]) if len(args) > 1 else 0))


if __name__ == "__main__":
    main()
