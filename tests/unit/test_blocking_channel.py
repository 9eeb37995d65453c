"""The Spark driver's blocking channel takes the client's channel options: a reply over gRPC's default
4 MiB receive limit (a listing of 100,000 topics is about 4.6 MB) arrives whole."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from ister.client.transport import open_blocking_channel

BIG = 6 * 1024 * 1024


def _big(request: bytes, context: Any) -> bytes:
    return b"x" * BIG


@pytest.fixture
def server() -> Iterator[int]:
    srv = grpc.server(
        futures.ThreadPoolExecutor(max_workers=2), options=[("grpc.max_send_message_length", 2 * BIG)]
    )
    handler = grpc.method_handlers_generic_handler(
        "test.Big", {"Get": grpc.unary_unary_rpc_method_handler(_big)}
    )
    srv.add_generic_rpc_handlers((handler,))
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    yield port
    srv.stop(None)


def test_a_reply_over_4_mib_arrives(server: int) -> None:
    with open_blocking_channel(f"http://127.0.0.1:{server}") as channel:
        got = channel.unary_unary("/test.Big/Get")(b"", timeout=30)
    assert len(got) == BIG


def test_a_plain_grpc_channel_refuses_it(server: int) -> None:
    """What the test above guards against: without the options the reply is refused."""
    with grpc.insecure_channel(f"127.0.0.1:{server}") as channel, pytest.raises(grpc.RpcError) as err:
        channel.unary_unary("/test.Big/Get")(b"", timeout=30)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
