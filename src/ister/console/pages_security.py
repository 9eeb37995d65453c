"""The security page (read-only): RBAC roles and bindings, as SecurityAdmin.ListRoles and ListAllBindings
answer them (the calls behind `ister admin security roles list` and `bindings list`). Reading them needs
ManageCluster; a token without it is told so in words, with a 403."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import grpc
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ister.console.pagekit import Render, denied, rpc_error
from ister.console.source import CALL_TIMEOUT_SECONDS, AdminSource
from ister.wire.gen import DanubeAdmin_pb2 as pb


def _security(source: AdminSource, render: Render) -> Callable[[Request], Awaitable[Response]]:
    async def security(request: Request) -> Response:
        try:
            roles = await source.security.ListRoles(pb.Empty(), timeout=CALL_TIMEOUT_SECONDS)
            bindings = await source.security.ListAllBindings(pb.Empty(), timeout=CALL_TIMEOUT_SECONDS)
        except grpc.RpcError as exc:
            if denied(exc):
                message = (
                    "This token may not read roles and bindings (they need the ManageCluster permission): "
                    f"{exc.details()}"
                )
                return render(
                    "security.html", 403, roles=None, bindings=None, refused=message, nav="security"
                )
            return rpc_error(render, exc, "security", "roles and bindings")
        used = {r for b in bindings.bindings for r in b.role_names}
        return render(
            "security.html",
            roles=sorted(roles.roles, key=lambda r: r.name),
            bindings=sorted(bindings.bindings, key=lambda b: (b.scope, b.resource_name, b.id)),
            used=used,
            refused="",
            nav="security",
        )

    return security


def routes(source: AdminSource, render: Render) -> list[Route]:
    return [Route("/security", _security(source, render))]
