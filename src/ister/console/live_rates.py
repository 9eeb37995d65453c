"""A topic's current rates as server-sent events, every REFRESH_SECONDS, for the topic page's charts (which
keep the series). One IsterAdmin.GetTopicStats call per tick; a failure is sent as `{"error": ...}`, and
the stream goes on, so the chart resumes when the admin API answers again."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import grpc
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from ister.console.source import CALL_TIMEOUT_SECONDS, AdminSource
from ister.wire.gen import ister_v1_pb2 as ister_pb

REFRESH_SECONDS = 2.0


async def topic_rates(source: AdminSource, topic: str) -> dict[str, object]:
    try:
        stats = await source.ister_admin.GetTopicStats(
            ister_pb.TopicStatsRequest(topic=topic), timeout=CALL_TIMEOUT_SECONDS
        )
    except grpc.RpcError as exc:
        return {"error": f"no rates now: {exc.details()} ({exc.code().name})"}
    t = stats.total
    return {
        "msg_in": t.msg_rate_in,
        "msg_out": t.msg_rate_out,
        "byte_in": t.byte_rate_in,
        "byte_out": t.byte_rate_out,
    }


def routes(source: AdminSource) -> list[Route]:
    async def events(request: Request) -> Response:
        topic = "/" + request.path_params["name"]

        async def stream() -> AsyncIterator[str]:
            while not await request.is_disconnected():
                yield f"event: rates\ndata: {json.dumps(await topic_rates(source, topic))}\n\n"
                await asyncio.sleep(REFRESH_SECONDS)

        return StreamingResponse(
            stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )

    return [Route("/events/topic/{name:path}", events)]
