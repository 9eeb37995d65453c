"""`--token` / `--tls-ca` for every client command: exported to the environment (ISTER_TOKEN,
ISTER_TLS_CA) that the Ister client reads, so benchmark children and Spark executors get them too.
`ister admin` also takes `--api-key` (ISTER_API_KEY), exchanged for a token at its first call."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from ister.client.api_key import API_KEY_ENV
from ister.client.transport import TLS_CA_ENV, TOKEN_ENV, Credentials

TokenOpt = Annotated[
    str | None,
    typer.Option("--token", envvar=TOKEN_ENV, help="bearer token (JWT) sent on every call (implies TLS)"),
]
ApiKeyOpt = Annotated[
    str | None,
    typer.Option(
        "--api-key",
        envvar=API_KEY_ENV,
        help="API key, exchanged for a short-lived token (a --token / ISTER_TOKEN wins; implies TLS)",
        show_default=False,
    ),
]
TlsCaOpt = Annotated[
    Path | None,
    typer.Option(
        "--tls-ca", envvar=TLS_CA_ENV, help="CA certificate (PEM) the broker's certificate chains to"
    ),
]


def use(token: str | None, tls_ca: Path | None, api_key: str | None = None) -> Credentials:
    """Record the options for this process (and its children); the credentials they make."""
    if token:
        os.environ[TOKEN_ENV] = token
    if api_key:
        os.environ[API_KEY_ENV] = api_key
    if tls_ca:
        if not tls_ca.is_file():
            raise typer.BadParameter(f"{tls_ca} is not a file", param_hint="--tls-ca")
        os.environ[TLS_CA_ENV] = str(tls_ca)
    return current()


def api_key() -> str | None:
    """The API key to exchange, when there is no token."""
    return None if os.environ.get(TOKEN_ENV) else os.environ.get(API_KEY_ENV) or None


def current() -> Credentials:
    return Credentials(token=os.environ.get(TOKEN_ENV) or None, tls_ca=os.environ.get(TLS_CA_ENV) or None)
