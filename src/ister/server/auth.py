"""Authentication and authorization on every RPC of every service: a gRPC server interceptor.

Installed only when security is on (`SecuritySettings.authentication`): with it off the servers have no
interceptor and a call costs nothing more. Each call is authenticated (a bearer JWT, else a verified client
certificate), then checked against `auth_rules.RULES` and the RBAC policy; a refusal is UNAUTHENTICATED or
PERMISSION_DENIED with a message saying what is missing, and an audit line. A method missing from the table
is refused (default-deny). Client streams are checked on their first frame; later frames cost nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from ister.broker.service import BrokerService
from ister.errors import PermissionDenied, Unauthenticated
from ister.security.audit import AuditLog
from ister.security.peer import PEER_METADATA, PeerSecret, verify_peer_token
from ister.security.rbac import CLUSTER, Resource
from ister.security.rbac_store import RbacStore
from ister.security.tokens import Principal, TokenVerifier
from ister.server.auth_rules import RULES, Rule
from ister.server.errors import status_message
from ister.server.handlers import Undecodable

log = logging.getLogger(__name__)

ANONYMOUS = Principal("anonymous", "", "none")  # the caller of a public method (ExchangeApiKey)

MISSING = (
    "authentication required: send `authorization: Bearer <JWT>` (danube-client with_token, ister --token / "
    "ISTER_TOKEN) or a client certificate over mutual TLS"
)


class Guard:
    """The decisions, independent of gRPC's handler plumbing (unit-testable)."""

    def __init__(
        self,
        verifier: TokenVerifier | None,
        rbac: RbacStore,
        audit: AuditLog,
        broker: BrokerService | None,
        mtls_identities: bool = True,
        peer: PeerSecret | None = None,
    ) -> None:
        self.verifier = verifier
        self.rbac = rbac
        self.audit = audit
        self.broker = broker
        self.mtls_identities = mtls_identities
        self.peer = peer or PeerSecret()
        self.owners: dict[int, str] = {}  # consumer id → owning principal name (pruned to live consumers)

    def authenticate(self, context: Any) -> Principal:
        for key, value in context.invocation_metadata() or ():
            if key == "authorization":
                scheme, _, token = str(value).partition(" ")
                if scheme.lower() != "bearer" or not token.strip():
                    raise Unauthenticated("authorization metadata must be `Bearer <JWT>`")
                if self.verifier is None:
                    raise Unauthenticated("this broker accepts no tokens (no security.auth.jwt keys)")
                return self.verifier.verify(token.strip())
        if self.mtls_identities:
            auth = context.auth_context() or {}
            names = auth.get("x509_common_name") or auth.get("x509_subject_alternative_name")
            if names:
                return Principal("service_account", names[0].decode(errors="replace"), "mtls")
        raise Unauthenticated(MISSING)

    def authenticate_peer(self, context: Any) -> Principal:
        """Another broker of this cluster (replication), by its `x-ister-peer` credentials only."""
        for key, value in context.invocation_metadata() or ():
            if key == PEER_METADATA:
                broker_id = verify_peer_token(self.peer.secret, str(value), time.time())
                return Principal("broker", str(broker_id), "peer")
        raise Unauthenticated("only brokers of this cluster may call this (peer credentials missing)")

    def authorize(self, principal: Principal, method: str, rule: Rule, request: Any) -> Resource:
        if isinstance(request, Undecodable):
            return CLUSTER  # the servicer refuses it with INVALID_ARGUMENT; nothing is read or changed
        resource = rule.resource(request)
        permission = rule.permission
        if permission is not None and not self.rbac.allows(principal, permission, resource):
            raise PermissionDenied(
                f"{principal} may not {_action(method)}: permission {permission} on {resource} "
                "is not granted by any role binding"
            )
        if rule.kind == "receive":
            self._own_consumer(principal, request.consumer_id)
        elif rule.kind == "ack":
            self._own_subscription(principal, resource, request.subscription_name)
        return resource

    def _own_consumer(self, principal: Principal, consumer_id: int) -> None:
        if self.owners.get(consumer_id) == principal.name or self.rbac.is_superuser(principal):
            return
        if self.broker is None or consumer_id in self.broker.consumers:  # unknown ids: NOT_FOUND as usual
            raise PermissionDenied(f"{principal} may not receive for consumer {consumer_id}: not its owner")

    def _own_subscription(self, principal: Principal, resource: Resource, subscription: str) -> None:
        """Acks and nacks on a subscription come from a principal that has a consumer on it here."""
        if self.broker is None or self.rbac.is_superuser(principal):
            return
        topic = self.broker.topics.get(resource.name)
        sub = topic.subscriptions.get(subscription) if topic is not None else None
        if sub is None:
            return  # nothing to ack here: the servicer answers as without security
        if not any(self.owners.get(cid) == principal.name for cid in sub.consumers):
            raise PermissionDenied(
                f"{principal} may not ack on subscription {subscription!r} of {resource.name}: "
                "it has no consumer there (a consumer acks only its own deliveries)"
            )

    def subscribed(self, principal: Principal, consumer_id: int) -> None:
        self.owners[consumer_id] = principal.name
        live = self.broker.consumers if self.broker is not None else None
        if live is not None and len(self.owners) > 2 * len(live) + 1024:
            self.owners = {cid: p for cid, p in self.owners.items() if cid in live}

    def denied(self, principal: Principal | None, method: str, resource: Resource | None, why: str) -> None:
        self.audit.record(
            str(principal) if principal is not None else "anonymous",
            _action(method),
            str(resource) if resource is not None else "-",
            f"denied: {why}",
        )


def _action(method: str) -> str:
    """`/danube_admin.TopicAdmin/DeleteTopic` → `TopicAdmin.DeleteTopic`."""
    service, _, name = method.rpartition("/")
    return f"{service.rsplit('.', 1)[-1]}.{name}"


class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(self, guard: Guard) -> None:
        self.guard = guard
        self._wrapped: dict[str, tuple[Any, Any]] = {}

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]], details: Any) -> Any:
        handler = await continuation(details)
        if handler is None:
            return None
        method = details.method
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self._wrap(method, handler)
        self._wrapped[method] = (handler, wrapped)
        return wrapped

    def _wrap(self, method: str, handler: Any) -> Any:
        rule = RULES.get(method)
        kw = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(self._unary(method, rule, handler.unary_unary), **kw)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._server_stream(method, rule, handler.unary_stream), **kw
            )
        if handler.stream_stream is not None:
            return grpc.stream_stream_rpc_method_handler(
                self._bidi(method, rule, handler.stream_stream), **kw
            )
        return grpc.stream_unary_rpc_method_handler(
            self._client_stream(method, rule, handler.stream_unary), **kw
        )

    async def _admit(
        self, method: str, rule: Rule | None, request: Any, context: Any
    ) -> tuple[Principal, Any]:
        """Authenticate and authorize, or abort the call."""
        g = self.guard
        principal: Principal | None = None
        resource: Resource | None = None
        if rule is not None and rule.kind == "public":
            return ANONYMOUS, None
        try:
            if rule is not None and rule.kind == "peer":
                return g.authenticate_peer(context), CLUSTER
            principal = g.authenticate(context)
            if rule is None:
                raise PermissionDenied(f"{_action(method)} is not open to any principal")
            resource = g.authorize(principal, method, rule, request)
            return principal, resource
        except Unauthenticated as exc:
            g.denied(principal, method, resource, str(exc))
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, status_message(str(exc)))
        except PermissionDenied as exc:
            g.denied(principal, method, resource, str(exc))
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, status_message(str(exc)))
        raise AssertionError("unreachable: abort raises")

    def _done(
        self, principal: Principal, method: str, rule: Rule | None, resource: Any, request: Any
    ) -> None:
        if rule is not None and rule.change:
            what = rule.audited(request) if rule.audited is not None else str(resource)
            self.guard.audit.record(str(principal), _action(method), what, "ok")

    def _unary(self, method: str, rule: Rule | None, behavior: Any) -> Any:
        async def call(request: Any, context: Any) -> Any:
            principal, resource = await self._admit(method, rule, request, context)
            response = await behavior(request, context)
            if rule is not None and rule.kind == "subscribe" and hasattr(response, "consumer_id"):
                self.guard.subscribed(principal, response.consumer_id)
            self._done(principal, method, rule, resource, request)
            return response

        return call

    def _server_stream(self, method: str, rule: Rule | None, behavior: Any) -> Any:
        async def call(request: Any, context: Any) -> AsyncIterator[Any]:
            await self._admit(method, rule, request, context)
            async for item in behavior(request, context):
                yield item

        return call

    def _bidi(self, method: str, rule: Rule | None, behavior: Any) -> Any:
        async def call(requests: Any, context: Any) -> AsyncIterator[Any]:
            it = requests.__aiter__()
            try:
                first = await it.__anext__()
            except StopAsyncIteration:
                first = None
            await self._admit(method, rule, first if first is not None else Undecodable("empty"), context)

            async def replay() -> AsyncIterator[Any]:
                if first is not None:
                    yield first
                async for request in it:
                    yield request

            async for item in behavior(replay(), context):
                yield item

        return call

    def _client_stream(self, method: str, rule: Rule | None, behavior: Any) -> Any:
        async def call(requests: Any, context: Any) -> Any:
            await self._admit(method, rule, Undecodable("stream"), context)
            return await behavior(requests, context)

        return call
