"""Options of cloud object stores: which go to obstore's store config, which to its HTTP client, and ours."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING

from ister.errors import InvalidArgument

if TYPE_CHECKING:
    from obstore.store import ClientConfig, RetryConfig

# Client (HTTP) options: routed to obstore's client_options instead of the store config.
_CLIENT_OPTIONS = frozenset(
    {
        "allow_http",
        "allow_invalid_certificates",
        "connect_timeout",
        "timeout",
        "read_timeout",
        "pool_idle_timeout",
        "pool_max_idle_per_host",
        "proxy_url",
        "proxy_excludes",
        "http1_only",
        "http2_only",
        "user_agent",
    }
)
_BOOL_CLIENT_OPTIONS = frozenset({"allow_http", "allow_invalid_certificates", "http1_only", "http2_only"})
# Names used by Danube's and other brokers' configs, mapped to obstore's.
_ALIASES = {"access_key": "access_key_id", "secret_key": "secret_access_key", "session_token": "token"}
_DEFAULT_CLIENT: dict[str, str] = {"connect_timeout": "5s", "timeout": "30s"}
_DEFAULT_MAX_RETRIES = 3
_DEFAULT_RETRY_TIMEOUT = 20.0


def _duration(value: str, what: str) -> str:
    """A duration option: plain seconds ('2.5') or obstore's human form ('2s', '500ms')."""
    try:
        seconds = float(value)
    except ValueError:
        if not re.fullmatch(r"\s*\d+(\.\d+)?\s*[a-zA-Z]+(\s+\d+(\.\d+)?\s*[a-zA-Z]+)*\s*", value):
            raise InvalidArgument(f"object store option {what}={value!r}: expected a duration") from None
        return value
    if not 0 < seconds <= 86_400:
        raise InvalidArgument(f"object store option {what}={value!r}: expected 0 < seconds <= 86400")
    return f"{round(seconds * 1000)}ms"


def _bool(value: str, what: str) -> str:
    low = str(value).strip().lower()
    if low in ("1", "true", "yes", "on"):
        return "true"
    if low in ("0", "false", "no", "off"):
        return "false"
    raise InvalidArgument(f"object store option {what}={value!r}: expected true or false")


def split_options(
    options: Mapping[str, str],
) -> tuple[dict[str, str], ClientConfig, RetryConfig]:
    """Split `open_store` options into obstore's store config, HTTP client options and retry config,
    validating our own keys (obstore validates the rest when the store is built)."""
    config: dict[str, str] = {}
    client: dict[str, str] = dict(_DEFAULT_CLIENT)
    max_retries = _DEFAULT_MAX_RETRIES
    retry_timeout = _DEFAULT_RETRY_TIMEOUT
    for raw_key, raw_value in options.items():
        if not isinstance(raw_key, str) or not isinstance(raw_value, str | int | float | bool):
            raise InvalidArgument(f"object store option {raw_key!r}: keys and values must be strings")
        key = _ALIASES.get(raw_key.lower(), raw_key.lower())
        value = str(raw_value)
        if key in _BOOL_CLIENT_OPTIONS:
            client[key] = _bool(value, key)
        elif key in ("connect_timeout", "timeout", "read_timeout", "pool_idle_timeout"):
            client[key] = _duration(value, key)
        elif key in _CLIENT_OPTIONS:
            client[key] = value
        elif key == "max_retries":
            if not value.isdigit() or int(value) > 100:
                raise InvalidArgument(f"object store option max_retries={value!r}: expected 0..100")
            max_retries = int(value)
        elif key == "retry_timeout":
            try:
                retry_timeout = float(value)
            except ValueError:
                raise InvalidArgument(f"object store option retry_timeout={value!r}: seconds") from None
            if not 0 < retry_timeout <= 3600:
                raise InvalidArgument(f"object store option retry_timeout={value!r}: 0 < seconds <= 3600")
        else:
            config[key] = value
    endpoint = config.get("endpoint", "")
    if endpoint.startswith("http://") and "allow_http" not in client:
        client["allow_http"] = "true"  # an explicit http:// endpoint (MinIO, SeaweedFS) means plain HTTP
    retry: RetryConfig = {"max_retries": max_retries, "retry_timeout": timedelta(seconds=retry_timeout)}
    return config, client, retry  # type: ignore[return-value]  # str values are accepted by obstore
