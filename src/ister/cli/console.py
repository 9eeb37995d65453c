"""`ister console`: serve the web console (docs/console.md)."""

from __future__ import annotations

from typing import Annotated

import typer

from ister.cli.admin_call import target_of
from ister.cli.main import app
from ister.cli.security_opts import TlsCaOpt, TokenOpt, use
from ister.config import split_host_port
from ister.errors import ConfigError


@app.command()
def console(
    admin_addr: Annotated[str, typer.Option("--admin-addr", help="the broker's admin gRPC HOST:PORT")],
    listen: Annotated[
        str, typer.Option("--listen", help="HOST:PORT the console serves on")
    ] = "127.0.0.1:8080",
    token: TokenOpt = None,
    tls_ca: TlsCaOpt = None,
) -> None:
    """Serve the web console, reading the broker's admin API only."""
    import uvicorn

    from ister.console.app import build_app
    from ister.console.source import AdminSource

    use(token, tls_ca)
    try:
        host, port = split_host_port(listen, "--listen")
    except ConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint="--listen") from None
    source = AdminSource(target_of(admin_addr), tls=admin_addr.strip().startswith("https://"))
    uvicorn.run(build_app(source), host=host, port=port, log_level="warning")
