"""A Danube-protocol gRPC server that stores nothing and answers at once: the ceiling of the protocol itself.

The danube-client cases run the same publish workload against it to show how much of a figure is gRPC and
client cost. It imports the generated Danube stubs, so it always runs as its own process (the official
danube-client registers the same proto package in whatever process imports it):

    python -m ister.benchmark.noop_server PORT
"""

from __future__ import annotations

import sys
from typing import Any

import grpc
import uvloop

from ister.wire.gen import DanubeApi_pb2 as pb
from ister.wire.gen import DanubeApi_pb2_grpc as pb_grpc

_url = ""


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


class Health(pb_grpc.HealthCheckServicer):  # type: ignore[misc]
    async def HealthCheck(self, request: Any, context: Any) -> Any:
        return pb.HealthCheckResponse(status=pb.HealthCheckResponse.OK)


async def serve(port: int) -> None:
    global _url
    _url = f"http://127.0.0.1:{port}"
    server = grpc.aio.server()
    pb_grpc.add_ProducerServiceServicer_to_server(Producer(), server)
    pb_grpc.add_DiscoveryServicer_to_server(Discovery(), server)
    pb_grpc.add_HealthCheckServicer_to_server(Health(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not args[0].isdigit():
        raise SystemExit("usage: python -m ister.benchmark.noop_server PORT")
    uvloop.run(serve(int(args[0])))


if __name__ == "__main__":
    main()
