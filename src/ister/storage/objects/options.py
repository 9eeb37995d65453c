"""Options of cloud object stores: which go to obstore's store config, which to its HTTP client, and ours.

The environment: obstore reads the standard variables of each cloud (`AWS_*` for s3://, `GOOGLE_*` for
gs://, `AZURE_*` for az://) into its store config by itself, including HTTP client settings such as
`AWS_ALLOW_HTTP` or `AWS_TIMEOUT`. But client options passed explicitly replace the client settings it
read from the environment as a whole (so `AWS_ALLOW_HTTP=true` alone used to be ignored, and a plain-HTTP
endpoint failed with "builder error"). So the client settings of the environment are read here and merged
under the explicit options: explicit options win, then the environment, then our defaults.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING

from ister.errors import InvalidArgument

if TYPE_CHECKING:
    from obstore.store import ClientConfig, RetryConfig

# Client (HTTP) options: routed to obstore's client_options instead of the store config (obstore's
# ClientConfig keys that take a string).
_CLIENT_OPTIONS = frozenset(
    {
        "allow_http",
        "allow_invalid_certificates",
        "connect_timeout",
        "default_content_type",
        "http1_only",
        "http2_keep_alive_interval",
        "http2_keep_alive_timeout",
        "http2_keep_alive_while_idle",
        "http2_only",
        "pool_idle_timeout",
        "pool_max_idle_per_host",
        "proxy_url",
        "proxy_ca_certificate",
        "proxy_excludes",
        "root_certificate",
        "randomize_addresses",
        "read_timeout",
        "timeout",
        "user_agent",
    }
)
_BOOL_CLIENT_OPTIONS = frozenset(
    {"allow_http", "allow_invalid_certificates", "http1_only", "http2_only", "randomize_addresses"}
)
_DURATION_CLIENT_OPTIONS = frozenset({"connect_timeout", "timeout", "read_timeout", "pool_idle_timeout"})
# The environment variable prefix obstore reads for each URL scheme.
_ENV_PREFIX = {
    "s3": "AWS_",
    "s3a": "AWS_",
    "gs": "GOOGLE_",
    "az": "AZURE_",
    "azure": "AZURE_",
    "abfs": "AZURE_",
    "abfss": "AZURE_",
    "adl": "AZURE_",
}
# Config keys (and, with the scheme's prefix, variable names) that set the service endpoint; an http://
# endpoint means plain HTTP unless allow_http says otherwise.
_ENDPOINT_KEYS = frozenset(
    {"endpoint", "endpoint_url", "endpoint_url_s3", "storage_endpoint", "base_url", "gcs_base_url"}
)
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


def _client_value(key: str, value: str, what: str) -> str:
    if key in _BOOL_CLIENT_OPTIONS:
        return _bool(value, what)
    if key in _DURATION_CLIENT_OPTIONS:
        return _duration(value, what)
    return value


def _unprefixed(key: str, prefix: str) -> str:
    """`key` without the scheme's prefix ('aws_allow_http' -> 'allow_http', 'google_base_url' ->
    'base_url'), as obstore accepts both forms; unchanged without it."""
    return key[len(prefix) :] if prefix and key.startswith(prefix) else key


def _from_environment(environ: Mapping[str, str], prefix: str) -> tuple[dict[str, str], list[str]]:
    """The HTTP client settings and the endpoints that obstore reads from the variables of `prefix`."""
    client: dict[str, str] = {}
    endpoints: list[str] = []
    if not prefix:
        return client, endpoints
    for name, value in environ.items():
        if not name.startswith(prefix):  # obstore matches the upper-case prefix only
            continue
        key = name[len(prefix) :].lower()
        if key in _CLIENT_OPTIONS:
            client[key] = _client_value(key, value, f"environment variable {name}")
        elif _unprefixed(key, "storage_") in _ENDPOINT_KEYS or key in _ENDPOINT_KEYS:
            endpoints.append(value)
    return client, endpoints


def split_options(
    options: Mapping[str, str],
    *,
    scheme: str = "s3",
    environ: Mapping[str, str] | None = None,
) -> tuple[dict[str, str], ClientConfig, RetryConfig]:
    """Split `open_store` options into obstore's store config, HTTP client options and retry config,
    validating our own keys (obstore validates the rest when the store is built). The HTTP client settings
    of the environment of `scheme`'s cloud (`environ`, default `os.environ`) are merged under the explicit
    options; an http:// endpoint (from the options, else the environment) allows plain HTTP unless
    allow_http is set either way."""
    prefix = _ENV_PREFIX.get(scheme.lower(), "")
    env_client, env_endpoints = _from_environment(os.environ if environ is None else environ, prefix)
    config: dict[str, str] = {}
    client: dict[str, str] = {**_DEFAULT_CLIENT, **env_client}
    endpoints: list[str] = []
    max_retries = _DEFAULT_MAX_RETRIES
    retry_timeout = _DEFAULT_RETRY_TIMEOUT
    low_prefix = prefix.lower()
    for raw_key, raw_value in options.items():
        if not isinstance(raw_key, str) or not isinstance(raw_value, str | int | float | bool):
            raise InvalidArgument(f"object store option {raw_key!r}: keys and values must be strings")
        key = _ALIASES.get(raw_key.lower(), raw_key.lower())
        value = str(raw_value)
        bare = _unprefixed(key, low_prefix)
        if bare in _CLIENT_OPTIONS:
            client[bare] = _client_value(bare, value, bare)
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
            if bare in _ENDPOINT_KEYS or _unprefixed(bare, "storage_") in _ENDPOINT_KEYS:
                endpoints.append(value)
    plain = any(e.strip().lower().startswith("http://") for e in endpoints or env_endpoints)
    if plain and "allow_http" not in client:
        client["allow_http"] = "true"  # an http:// endpoint (MinIO, SeaweedFS) means plain HTTP
    retry: RetryConfig = {"max_retries": max_retries, "retry_timeout": timedelta(seconds=retry_timeout)}
    return config, client, retry  # type: ignore[return-value]  # str values are accepted by obstore
