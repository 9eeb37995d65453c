"""Reset a subscription's cursor from the console: a form, a preview (the broker's dry run, which also
asks RBAC), then the POST that moves it. The same IsterAdmin.ResetCursor call as the CLI's."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import grpc
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from ister.console.source import AdminSource
from ister.core.timespec import parse_time
from ister.errors import InvalidArgument
from ister.wire.gen import ister_v1_pb2 as ister_pb

Render = Callable[..., Response]
U64_MAX = 2**64 - 1


def reset_request(topic: str, subscription: str, to: str, at: str) -> ister_pb.ResetCursorRequest:
    """The request for the form's position (earliest, latest, an offset, or a time); ValueError if bad."""
    request = ister_pb.ResetCursorRequest(topic=topic, subscription=subscription)
    to, at = to.strip(), at.strip()
    if not subscription:
        raise ValueError("choose a subscription")
    if (to == "") == (at == ""):
        raise ValueError("give exactly one of a position or a time")
    if at:
        try:
            request.time_ms = parse_time(at, time.time_ns() // 1_000_000)
        except InvalidArgument as exc:
            raise ValueError(str(exc)) from None
    elif to == "earliest":
        request.earliest = True
    elif to == "latest":
        request.latest = True
    elif to.isascii() and to.isdigit() and int(to) <= U64_MAX:
        request.offset = int(to)
    else:
        raise ValueError(f"{to!r}: use earliest, latest or an offset")
    return request


def routes(source: AdminSource, render: Render) -> Callable[[Request], Awaitable[Response]]:
    async def reset(request: Request) -> Response:
        topic = "/" + request.path_params["name"]
        if request.method == "GET":
            sub = request.query_params.get("subscription", "")
            return render(
                "reset.html", topic=topic, sub=sub, to="", at="", preview=None, error="", nav="topics"
            )
        form = await request.form()
        sub, to, at = (str(form.get(k, "")) for k in ("subscription", "to", "at"))
        ctx = {"topic": topic, "sub": sub, "to": to, "at": at, "nav": "topics"}
        try:
            req = reset_request(topic, sub, to, at)
        except ValueError as exc:
            return render("reset.html", 400, preview=None, error=str(exc), **ctx)
        confirmed = form.get("confirm") == "yes"
        req.dry_run = not confirmed
        try:
            answer = await source.reset_cursor(req)
        except grpc.RpcError as exc:
            denied = exc.code() in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED)
            status = 403 if denied else 400
            return render(
                "reset.html", status, preview=None, error=f"{exc.details()} ({exc.code().name})", **ctx
            )
        if confirmed:
            return RedirectResponse(f"/topic{topic}?reset={sub}", status_code=303)
        return render("reset.html", preview=answer.positions, error="", **ctx)

    return reset
