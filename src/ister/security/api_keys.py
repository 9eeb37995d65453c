"""API keys: long-lived secrets bound to a principal, exchanged for short-lived JWTs.

A key reads `ister_<id>_<secret>`: `id` (16 hex digits) names the record `/auth/api_keys/<id>` in the
metadata store, `secret` (256 random bits) is stored only as its SHA-256 (a random secret needs no salt or
slow hash). `ExchangeApiKey` reads the record from the store at every exchange (so a revoke made on any
broker holds at once on all of them), compares the hash in constant time and mints an HS256 token with the
broker's `security.auth.jwt.secret_file`, valid at most `security.auth.api_keys.token_ttl_seconds`.
Tokens already exchanged stay valid until they expire: a short TTL is what bounds a revoked key's reach.
Keys and secrets are never logged.

`create_token` (IsterAdmin.CreateToken) mints a token for any principal with the same secret, issuer and
audience, valid at most `security.auth.jwt.max_token_ttl_seconds`.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ister.config import JwtSettings
from ister.errors import FailedPrecondition, InvalidArgument, NotFound, Unauthenticated
from ister.metadata.store import MetadataStore, list_all
from ister.security.audit import AuditLog
from ister.security.tokens import DEFAULT_ISSUER, PRINCIPAL_TYPES, Principal, TokenVerifier, mint

API_KEYS = "/auth/api_keys/"
KEY_PREFIX = "ister_"
_KEY = re.compile(r"ister_([0-9a-f]{16})_([A-Za-z0-9_-]{20,100})")
MAX_DESCRIPTION = 256


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class ApiKey:
    id: str
    principal_type: str
    principal_name: str
    description: str
    created_at_ms: int

    @property
    def principal(self) -> Principal:
        return Principal(self.principal_type, self.principal_name, "api_key")


def _record(value: Any) -> tuple[ApiKey, str]:
    key = ApiKey(
        id=str(value["id"]),
        principal_type=str(value["principal_type"]),
        principal_name=str(value["principal_name"]),
        description=str(value.get("description", "")),
        created_at_ms=int(value.get("created_at_ms", 0)),
    )
    return key, str(value["secret_sha256"])


class ApiKeyStore:
    def __init__(
        self,
        store: MetadataStore,
        jwt_settings: JwtSettings,
        verifier: TokenVerifier | None,
        token_ttl_seconds: int,
        audit: AuditLog | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.jwt = jwt_settings
        self.verifier = verifier
        self.token_ttl_seconds = token_ttl_seconds
        self.audit = audit
        self.clock = clock

    # -- IsterAdmin ----------------------------------------------------------------------------------------
    async def create(
        self, principal_name: str, principal_type: str = "", description: str = ""
    ) -> tuple[ApiKey, str]:
        """A new key for the principal: (its record, the key text, shown this once)."""
        principal_type = principal_type or "service_account"
        if principal_type not in PRINCIPAL_TYPES:
            raise InvalidArgument(f"principal type must be one of {', '.join(PRINCIPAL_TYPES)}")
        if not principal_name or len(principal_name) > 256:
            raise InvalidArgument("the principal name must be 1..256 characters")
        if len(description) > MAX_DESCRIPTION:
            raise InvalidArgument(f"the description must be at most {MAX_DESCRIPTION} characters")
        key_id = secrets.token_hex(8)
        secret = secrets.token_urlsafe(32)
        key = ApiKey(key_id, principal_type, principal_name, description, int(self.clock() * 1000))
        await self.store.put(
            f"{API_KEYS}{key_id}",
            {
                "id": key.id,
                "principal_type": key.principal_type,
                "principal_name": key.principal_name,
                "description": key.description,
                "created_at_ms": key.created_at_ms,
                "secret_sha256": _digest(secret),
            },
        )
        return key, f"{KEY_PREFIX}{key_id}_{secret}"

    async def list(self) -> list[ApiKey]:
        out = []
        for kv in await list_all(self.store, API_KEYS):
            try:
                out.append(_record(kv.value)[0])
            except (KeyError, TypeError, ValueError):
                continue  # a malformed record is never a usable key
        return sorted(out, key=lambda k: (k.created_at_ms, k.id))

    async def revoke(self, key_id: str) -> None:
        if not re.fullmatch(r"[0-9a-f]{16}", key_id) or not await self.store.delete(f"{API_KEYS}{key_id}"):
            raise NotFound(f"API key {key_id[:32]!r} does not exist")

    def _signing_secret(self, what: str) -> bytes:
        secret = self.verifier.signing_secret() if self.verifier is not None else None
        if secret is None:
            raise FailedPrecondition(
                f"this broker cannot {what}: it has no HS256 secret to sign tokens with "
                "(security.auth.jwt.secret_file)"
            )
        return secret

    def _mint(self, secret: bytes, principal_name: str, principal_type: str, ttl: int) -> tuple[str, int]:
        """(an HS256 token with the configured issuer and audience, its exp as Unix seconds)."""
        now = self.clock()
        token = mint(
            secret,
            principal_name,
            ttl,
            principal_type=principal_type,
            issuer=self.jwt.issuer or DEFAULT_ISSUER,
            audience=self.jwt.audience,
            now=now,
        )
        return token, int(now) + ttl

    # -- IsterAdmin.CreateToken ----------------------------------------------------------------------------
    def create_token(self, principal_name: str, principal_type: str, ttl_seconds: int) -> tuple[str, int]:
        """(a token for the principal, valid `ttl_seconds`, its exp as Unix seconds)."""
        principal_type = principal_type or "service_account"
        if principal_type not in PRINCIPAL_TYPES:
            raise InvalidArgument(f"principal type must be one of {', '.join(PRINCIPAL_TYPES)}")
        if not principal_name or len(principal_name) > 256:
            raise InvalidArgument("the principal name must be 1..256 characters")
        limit = self.jwt.max_token_ttl_seconds
        if not 0 < ttl_seconds <= limit:
            raise InvalidArgument(
                f"ttl_seconds must be in 1..{limit} (security.auth.jwt.max_token_ttl_seconds), "
                f"got {ttl_seconds}"
            )
        return self._mint(self._signing_secret("mint tokens"), principal_name, principal_type, ttl_seconds)

    # -- ExchangeApiKey ------------------------------------------------------------------------------------
    async def exchange(self, api_key: str, ttl_seconds: int = 0) -> tuple[str, float, ApiKey]:
        """(token, its exp as Unix seconds, the key's record); Unauthenticated for a bad key."""
        secret = self._signing_secret("exchange API keys")
        match = _KEY.fullmatch(api_key.strip())
        found = await self.store.get(f"{API_KEYS}{match.group(1)}") if match else None
        try:
            key, digest = _record(found.value) if found is not None else (None, "")
        except (KeyError, TypeError, ValueError):
            key, digest = None, ""
        presented = _digest(match.group(2)) if match else ""
        if key is None or match is None or not hmac.compare_digest(presented, digest):
            why = "unknown, revoked or wrong API key"
            if self.audit is not None:
                key_id = match.group(1) if match else "?"
                self.audit.record("anonymous", "Ister.ExchangeApiKey", f"api_key:{key_id}", f"denied: {why}")
            raise Unauthenticated(f"invalid API key: {why}")
        ttl = min(ttl_seconds, self.token_ttl_seconds) if ttl_seconds > 0 else self.token_ttl_seconds
        token, exp = self._mint(secret, key.principal_name, key.principal_type, ttl)
        return token, exp, key
