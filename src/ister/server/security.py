"""Builds the broker's security from its configuration: the RBAC store (always: SecurityAdmin works with
security off, to prepare roles before turning it on), and, only when authentication is on, the token
verifier, audit log and the interceptor that the gRPC servers install."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from ister.broker.service import BrokerService
from ister.config import BrokerConfig
from ister.security.api_keys import ApiKeyStore
from ister.security.audit import AuditLog
from ister.security.peer import PeerSecret
from ister.security.rbac_store import RbacStore
from ister.security.tokens import TokenVerifier
from ister.server.auth import AuthInterceptor, Guard

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Security:
    rbac: RbacStore
    api_keys: ApiKeyStore
    interceptors: list[Any] = field(default_factory=list)

    async def close(self) -> None:
        await self.rbac.close()


async def start_security(
    config: BrokerConfig, broker: BrokerService, peer: PeerSecret | None = None
) -> Security:
    sec = config.security
    rbac = RbacStore(broker.store, sec.superusers)
    await rbac.start()
    ttl = sec.auth.api_keys.token_ttl_seconds
    if not sec.authentication:
        if sec.superusers:
            log.warning("security.superusers is set but authentication is off: every call is allowed")
        return Security(rbac, ApiKeyStore(broker.store, sec.auth.jwt, None, ttl))
    verifier = TokenVerifier(sec.auth.jwt) if sec.auth.jwt.configured else None
    audit = AuditLog(sec.audit.max_lines_per_second, sec.audit.enabled)
    api_keys = ApiKeyStore(broker.store, sec.auth.jwt, verifier, ttl, audit)
    guard = Guard(verifier, rbac, audit, broker, mtls_identities=sec.auth.mtls_identities, peer=peer)
    for port, addr in (("client", config.broker_addr), ("admin", config.admin_addr)):
        if sec.tls.for_port(port) is None:  # type: ignore[arg-type]
            log.warning(
                "SECURITY WARNING: authentication is on but the %s port %s has no TLS: bearer tokens "
                "travel in cleartext",
                port,
                addr,
            )
    log.info(
        "security on: authentication (%s), default-deny authorization, %d superuser(s)",
        ", ".join([m for m, on in (("jwt", verifier is not None), ("mtls", sec.auth.mtls_identities)) if on]),
        len(sec.superusers),
    )
    return Security(rbac, api_keys, [AuthInterceptor(guard)])
