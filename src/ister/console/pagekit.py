"""What the page modules share: a failed admin call as a page, in the broker's own words."""

from __future__ import annotations

from collections.abc import Callable

import grpc
from starlette.responses import Response

Render = Callable[..., Response]

STATUS = {
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
}


def denied(exc: grpc.RpcError) -> bool:
    return exc.code() in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED)


def rpc_error(render: Render, exc: grpc.RpcError, nav: str, what: str = "admin API") -> Response:
    """Not found, not permitted, refused, or unreachable (503, with the unreachable banner's id)."""
    code = exc.code()
    status = STATUS.get(code, 503)
    message = f"{what}: {exc.details()} ({code.name})"
    return render("error.html", status, message=message, nav=nav, unreachable=status == 503)
