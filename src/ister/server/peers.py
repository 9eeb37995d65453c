"""The address of the client behind a call (no Danube protobuf modules here: `ister_api` imports it, and
modules that import `danube`'s own generated protos must never load Ister's copies of them)."""

from __future__ import annotations

from typing import Any


def peer_address(context: Any) -> str:
    """The client's address as gRPC reports it (`ipv4:127.0.0.1:53712`), for the admin API's stats."""
    try:
        return str(context.peer() or "")
    except Exception:  # a context without a transport (tests)
        return ""
