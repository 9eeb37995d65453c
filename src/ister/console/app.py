"""The console's ASGI app (Starlette): server-rendered Jinja2 pages, live overview by server-sent events."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ister.console import cursors, health, live_rates, pagekit, pages_cluster, pages_schemas, pages_security
from ister.console.source import AdminSource

HERE = Path(__file__).parent
REFRESH_SECONDS = 2.0

_env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html"]))
_env.globals.update(when=health.when, retry=health.retry)


def _render(template: str, status: int = 200, **ctx: object) -> HTMLResponse:
    return HTMLResponse(_env.get_template(template).render(**ctx), status_code=status)


def _rpc_error(exc: grpc.RpcError, nav: str, what: str = "admin API") -> Response:
    return pagekit.rpc_error(_render, exc, nav, what)


def _messages_route(source: AdminSource) -> Callable[[Request], Awaitable[Response]]:
    """The message browser: a peek by offset range (never a subscription or a cursor)."""

    async def messages(request: Request) -> Response:
        name = "/" + request.path_params["name"]
        raw_from, raw_count = request.query_params.get("from", ""), request.query_params.get("count", "20")
        if (
            not (raw_from == "" or raw_from.isdigit())
            or not raw_count.isdigit()
            or not 1 <= int(raw_count) <= 1000
        ):
            message = "from must be an offset (or empty: the earliest), count 1..1000"
            return _render("error.html", 400, message=message, nav="topics")
        try:
            peeked = await source.peek(name, int(raw_from) if raw_from else None, int(raw_count))
        except grpc.RpcError as exc:
            return _rpc_error(exc, "topics", name)
        return _render(
            "messages.html", topic=name, rows=peeked.messages, start=raw_from, count=raw_count, nav="topics"
        )

    return messages


def build_app(source: AdminSource) -> Starlette:
    async def overview(request: Request) -> Response:
        return _render("overview.html", view=await source.overview(), target=source.target, nav="overview")

    async def overview_fragment(request: Request) -> Response:
        return _render("overview_body.html", view=await source.overview())

    async def events(request: Request) -> Response:
        async def stream() -> AsyncIterator[str]:
            while not await request.is_disconnected():
                view = await source.overview()
                html = _env.get_template("overview_body.html").render(view=view)
                yield f"event: overview\ndata: {json.dumps(html)}\n\n"
                await asyncio.sleep(REFRESH_SECONDS)

        return StreamingResponse(
            stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )

    async def topics(request: Request) -> Response:
        q = request.query_params
        try:
            page = await source.topic_page(
                q.get("q", ""),
                q.get("sort", "name"),
                q.get("desc", "") == "1",
                int(q.get("page", "1")),
                int(q.get("size", "50")),
            )
        except ValueError as exc:
            return _render("error.html", 400, message=str(exc), nav="topics")
        except grpc.RpcError as exc:
            return _rpc_error(exc, "topics")
        return _render(
            "topics.html",
            page=page,
            q=q.get("q", ""),
            sort=q.get("sort", "name"),
            desc=q.get("desc", "") == "1",
            size=int(q.get("size", "50")),
            nav="topics",
        )

    async def topic(request: Request) -> Response:
        name = "/" + request.path_params["name"]
        try:
            described, stats = await source.topic(name)
        except grpc.RpcError as exc:
            return _rpc_error(exc, "topics", name)
        subs = stats.total.subscriptions
        writable = bool(subs) and await source.may_reset(name, subs[0].subscription)
        return _render(
            "topic.html",
            topic=name,
            d=described,
            s=stats.total,
            writable=writable,
            nav="topics",
            reset=request.query_params.get("reset", ""),
        )

    async def subscriptions(request: Request) -> Response:
        try:
            listed = await source.subscriptions()
        except grpc.RpcError as exc:
            return _rpc_error(exc, "subscriptions")
        return _render(
            "subscriptions.html", subs=listed.subscriptions, failed=listed.failed_brokers, nav="subscriptions"
        )

    async def shutdown() -> None:
        await source.close()

    return Starlette(
        routes=[
            Route("/", overview),
            Route("/fragments/overview", overview_fragment),
            Route("/events", events),
            Route("/topics", topics),
            Route("/reset/{name:path}", cursors.routes(source, _render), methods=["GET", "POST"]),
            Route("/topic/{name:path}", topic),
            Route("/messages/{name:path}", _messages_route(source)),
            Route("/subscriptions", subscriptions),
            *live_rates.routes(source),
            *pages_cluster.routes(source, _render),
            *pages_schemas.routes(source, _render),
            *pages_security.routes(source, _render),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ],
        on_startup=[source.open],
        on_shutdown=[shutdown],
    )
