"""How brokers of one cluster prove to each other that they are brokers of it (replication streams).

The cluster's brokers share a random secret kept in the metadata store (`/ister/peer-secret`, created by
the first broker that needs it): whoever can read the cluster's etcd is already trusted with all of it. A
broker opening a replica stream sends `x-ister-peer: <broker id>.<unix time>.<HMAC-SHA256 of both>`; the
leader's authentication accepts it for `IsterReplica` only, within `MAX_SKEW_SECONDS` of its own clock.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from ister.errors import Unauthenticated

PEER_METADATA = "x-ister-peer"
MAX_SKEW_SECONDS = 300


@dataclass
class PeerSecret:
    """The cluster's peer secret once this broker has read it (None: standalone, or not yet)."""

    secret: bytes | None = None


def new_secret() -> str:
    return secrets.token_hex(32)


def _mac(secret: bytes, broker_id: int, at: int) -> str:
    return hmac.new(secret, f"{broker_id}.{at}".encode(), hashlib.sha256).hexdigest()


def peer_token(secret: bytes, broker_id: int, now: float) -> str:
    at = int(now)
    return f"{broker_id}.{at}.{_mac(secret, broker_id, at)}"


def verify_peer_token(secret: bytes | None, token: str, now: float) -> int:
    """The broker id a valid token names; Unauthenticated otherwise."""
    if secret is None:
        raise Unauthenticated("this broker cannot check peer credentials yet (no cluster peer secret)")
    parts = token.split(".")
    if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit():
        raise Unauthenticated("malformed peer credentials")
    broker_id, at = int(parts[0]), int(parts[1])
    if abs(now - at) > MAX_SKEW_SECONDS:
        raise Unauthenticated("peer credentials expired (or the brokers' clocks disagree)")
    if not hmac.compare_digest(parts[2], _mac(secret, broker_id, at)):
        raise Unauthenticated("peer credentials do not match this cluster's secret")
    return broker_id
