"""JWT: validating bearer tokens (HS256 secret, RS256/ES256 public keys or a JWKS file) and minting them.

Claims follow Danube (`iss`, `exp`, `sub`, `principal_type`, `principal_name`), so tokens minted by
`danube-admin security tokens create` work here and ours work against Danube. `exp` is required; `nbf`,
`iss` (when `issuer` is set) and `aud` (when `audience` is set) are checked with `leeway_seconds` of clock
skew. A valid token is remembered by its text (bounded) until its `exp`: a repeated call costs a dict
lookup. Key files are re-read when they change (checked at most once a second); that empties the cache.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

# jwt and cryptography are imported where a token or key is handled, not here: they cost ~0.2 s of CPU at
# every broker and CLI start, and most brokers run without authentication.
from ister.config import JwtSettings
from ister.errors import ConfigError, InvalidArgument, Unauthenticated
from ister.security.files import WatchedFiles, read_file

PRINCIPAL_TYPES = ("service_account", "user", "broker_internal")
DEFAULT_ISSUER = "danube-auth"
TOKEN_CACHE_ENTRIES = 10_000
KEY_CHECK_SECONDS = 1.0
MAX_TOKEN_BYTES = 8192


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: `type` (service_account, user, …), `name` (what bindings and superusers name) and how
    they proved it (`jwt`, `mtls`)."""

    type: str
    name: str
    method: str

    def __str__(self) -> str:
        return f"{self.type}:{self.name}"


class _Keys:
    def __init__(self, settings: JwtSettings) -> None:
        self.secret: bytes | None = None
        self.public: list[tuple[str, Any]] = []  # (algorithm, key)
        self.by_kid: dict[str, tuple[str, Any]] = {}
        if settings.secret_file:
            self.secret = read_file(settings.secret_file, "JWT secret file").strip()
            if len(self.secret) < 16:
                raise ConfigError(f"JWT secret file {settings.secret_file}: use at least 16 bytes")
        import jwt
        from cryptography.hazmat.primitives.serialization import load_pem_public_key

        for path in settings.public_key_files:
            try:
                key = load_pem_public_key(read_file(path, "JWT public key"))
            except ValueError as exc:
                raise ConfigError(f"JWT public key {path}: not a PEM public key: {exc}") from None
            self.public.append((_algorithm(key, path), key))
        if settings.jwks_file:
            try:
                jwks = jwt.PyJWKSet.from_json(read_file(settings.jwks_file, "JWKS file").decode())
            except (jwt.PyJWKSetError, ValueError, json.JSONDecodeError) as exc:
                raise ConfigError(f"JWKS file {settings.jwks_file}: {exc}") from None
            for k in jwks.keys:
                entry = (_algorithm(k.key, settings.jwks_file), k.key)
                if k.key_id:
                    self.by_kid[k.key_id] = entry
                else:
                    self.public.append(entry)

    def candidates(self, alg: str, kid: str | None) -> list[Any]:
        if alg == "HS256":
            return [self.secret] if self.secret is not None else []
        if kid is not None and kid in self.by_kid:
            found = self.by_kid[kid]
            return [found[1]] if found[0] == alg else []
        return [key for a, key in [*self.public, *self.by_kid.values()] if a == alg]


def _algorithm(key: Any, where: str) -> str:
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    if isinstance(key, rsa.RSAPublicKey):
        return "RS256"
    if isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name == "secp256r1":
        return "ES256"
    raise ConfigError(f"{where}: only RSA (RS256) and P-256 EC (ES256) public keys are supported")


class TokenVerifier:
    def __init__(self, settings: JwtSettings, clock: Any = time.time) -> None:
        self.settings = settings
        self.clock = clock
        self._files = WatchedFiles(
            [settings.secret_file or "", *settings.public_key_files, settings.jwks_file or ""]
        )
        self._keys = _Keys(settings)
        self._checked_at = time.monotonic()
        self._cache: OrderedDict[str, tuple[Principal, float]] = OrderedDict()

    def _refresh_keys(self) -> None:
        now = time.monotonic()
        if now - self._checked_at < KEY_CHECK_SECONDS:
            return
        self._checked_at = now
        if self._files.changed():
            self._files.read()
            self._keys = _Keys(self.settings)  # a broken rewrite raises ConfigError: the old keys stay
            self._cache.clear()

    def signing_secret(self) -> bytes | None:
        """The HS256 secret in use (re-read when its file changed), None without one."""
        with contextlib.suppress(ConfigError):
            self._refresh_keys()
        return self._keys.secret

    def verify(self, token: str) -> Principal:
        """The principal a bearer token names; Unauthenticated (with the reason) when it is not valid."""
        hit = self._cache.get(token)
        if hit is not None and self.clock() <= hit[1]:
            return hit[0]
        with contextlib.suppress(ConfigError):  # a broken key file: keep the keys in use
            self._refresh_keys()
        principal, exp = self._decode(token)
        self._cache[token] = (principal, exp + self.settings.leeway_seconds)
        if len(self._cache) > TOKEN_CACHE_ENTRIES:
            self._cache.popitem(last=False)
        return principal

    def _decode(self, token: str) -> tuple[Principal, float]:
        if len(token) > MAX_TOKEN_BYTES:
            raise Unauthenticated("invalid token: longer than 8 KiB")
        import jwt

        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError:
            raise Unauthenticated("invalid token: not a JWT") from None
        alg = str(header.get("alg", ""))
        if alg not in ("HS256", "RS256", "ES256"):
            raise Unauthenticated(f"invalid token: algorithm {alg[:20]!r} is not accepted")
        keys = self._keys.candidates(alg, header.get("kid"))
        if not keys:
            raise Unauthenticated(f"invalid token: no {alg} key is configured to verify it")
        s = self.settings
        last: Exception | None = None
        for key in keys:
            try:
                claims = jwt.decode(
                    token,
                    key,
                    algorithms=[alg],
                    issuer=s.issuer,
                    audience=s.audience,
                    leeway=s.leeway_seconds,
                    options={"require": ["exp"], "verify_aud": s.audience is not None},
                )
                return _principal(claims), float(claims["exp"])
            except jwt.InvalidSignatureError as exc:
                last = exc
            except jwt.ExpiredSignatureError:
                raise Unauthenticated("invalid token: expired (exp is in the past)") from None
            except jwt.ImmatureSignatureError:
                raise Unauthenticated("invalid token: not valid yet (nbf is in the future)") from None
            except jwt.InvalidIssuerError:
                raise Unauthenticated(f"invalid token: issuer is not {s.issuer!r}") from None
            except jwt.InvalidAudienceError:
                raise Unauthenticated(f"invalid token: audience does not include {s.audience!r}") from None
            except jwt.MissingRequiredClaimError as exc:
                raise Unauthenticated(f"invalid token: claim {exc.claim!r} is missing") from None
            except jwt.InvalidTokenError as exc:
                raise Unauthenticated(f"invalid token: {type(exc).__name__}") from None
        raise Unauthenticated(f"invalid token: signature does not verify ({type(last).__name__})")


def _principal(claims: dict[str, Any]) -> Principal:
    name = claims.get("principal_name") or claims.get("sub")
    if not isinstance(name, str) or not name:
        raise Unauthenticated("invalid token: neither principal_name nor sub names a principal")
    kind = claims.get("principal_type")
    if kind not in PRINCIPAL_TYPES:
        kind = "service_account"
    return Principal(str(kind), name, "jwt")


def parse_ttl(text: str) -> int:
    """`90s`, `15m`, `1h`, `30d` or a bare number of seconds."""
    text = text.strip().lower()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
    scale = units.get(text[-1:])
    digits = text[:-1] if scale is not None else text
    if not digits.isdigit() or int(digits) <= 0:
        raise InvalidArgument(f"invalid ttl {text!r}: expected a positive number with s, m, h or d")
    return int(digits) * (scale or 1)


def mint(
    secret: bytes,
    principal: str,
    ttl_seconds: int,
    *,
    principal_type: str = "service_account",
    issuer: str = DEFAULT_ISSUER,
    audience: str | None = None,
    now: float | None = None,
) -> str:
    """An HS256 token with Danube's claims (plus `iat`/`nbf`, and `aud` when given)."""
    if principal_type not in PRINCIPAL_TYPES:
        raise InvalidArgument(f"principal type must be one of {', '.join(PRINCIPAL_TYPES)}")
    if not principal:
        raise InvalidArgument("the principal name must not be empty")
    issued = int(time.time() if now is None else now)
    claims: dict[str, Any] = {
        "iss": issuer,
        "sub": principal,
        "principal_type": principal_type,
        "principal_name": principal,
        "iat": issued,
        "nbf": issued,
        "exp": issued + ttl_seconds,
    }
    if audience:
        claims["aud"] = audience
    import jwt

    return jwt.encode(claims, secret, algorithm="HS256")
