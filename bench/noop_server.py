"""A Danube-protocol gRPC server that stores nothing and answers at once: the ceiling of the protocol itself.

The benchmark runs the same client workload against it to show how much of a figure is gRPC + client cost.
usage: python bench/noop_server.py PORT
"""

from __future__ import annotations

import sys
from typing import Any

import grpc
import uvloop

from ister.wire.gen import DanubeApi_pb2 as pb
from ister.wire.gen import DanubeApi_pb2_grpc as pb_grpc

URL = ""


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
            request_id=request.request_id, response_type=1, connect_url=URL, broker_url=URL
        )


class Health(pb_grpc.HealthCheckServicer):  # type: ignore[misc]
    async def HealthCheck(self, request: Any, context: Any) -> Any:
        return pb.HealthCheckResponse(status=0)


async def main(port: int) -> None:
    global URL
    URL = f"http://127.0.0.1:{port}"
    server = grpc.aio.server()
    pb_grpc.add_ProducerServiceServicer_to_server(Producer(), server)
    pb_grpc.add_DiscoveryServicer_to_server(Discovery(), server)
    pb_grpc.add_HealthCheckServicer_to_server(Health(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


if __name__ == "__main__":
    uvloop.run(main(int(sys.argv[1])))
