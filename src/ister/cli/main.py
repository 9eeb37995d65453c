"""The `ister` command."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from ister.config import load_config
from ister.errors import ConfigError, IsterError, StartTimeout

# add_completion: `ister --install-completion [bash|zsh|fish|powershell]` and `--show-completion` (typer).
START_TIMEOUT_EXIT = 3  # `ister broker`: a dependency (etcd, the object store) not reached in time

app = typer.Typer(no_args_is_help=True, help="Ister: a Danube-compatible messaging broker.")


def _show_version(value: bool) -> None:
    if value:
        from ister.version import describe

        typer.echo(describe())
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", "-V", callback=_show_version, is_eager=True, help="Show the version and exit."
        ),
    ] = False,
) -> None:
    """Ister: a Danube-compatible messaging broker."""


@app.command()
def broker(
    mode: Annotated[str | None, typer.Option(help="standalone (default) or cluster")] = None,
    data_dir: Annotated[Path | None, typer.Option("--data-dir", help="WAL and metadata directory")] = None,
    broker_addr: Annotated[str | None, typer.Option("--broker-addr", help="client gRPC HOST:PORT")] = None,
    advertised_addr: Annotated[
        str | None, typer.Option("--advertised-addr", help="address given to clients")
    ] = None,
    admin_addr: Annotated[str | None, typer.Option("--admin-addr", help="admin gRPC HOST:PORT")] = None,
    prom_exporter: Annotated[str | None, typer.Option("--prom-exporter", help="Prometheus HOST:PORT")] = None,
    config_file: Annotated[Path | None, typer.Option("--config-file", help="YAML configuration")] = None,
    etcd_endpoints: Annotated[
        str | None, typer.Option("--etcd-endpoints", help="cluster mode: etcd HOST:PORT[,HOST:PORT...]")
    ] = None,
    etcd_tls_ca: Annotated[
        Path | None, typer.Option("--etcd-tls-ca", help="cluster mode: TLS to etcd, CA of its certificate")
    ] = None,
    etcd_tls_cert: Annotated[
        Path | None, typer.Option("--etcd-tls-cert", help="cluster mode: client certificate for etcd (PEM)")
    ] = None,
    etcd_tls_key: Annotated[
        Path | None, typer.Option("--etcd-tls-key", help="cluster mode: client certificate key for etcd")
    ] = None,
    cluster_name: Annotated[str | None, typer.Option("--cluster-name", help="cluster mode: name")] = None,
    zone: Annotated[
        str | None, typer.Option("--zone", help="cluster mode: this broker's zone (replica placement)")
    ] = None,
    durable_url: Annotated[
        str | None,
        typer.Option("--durable-url", help="durable tier: file:///dir, s3://bucket/prefix, … or none"),
    ] = None,
    fsync: Annotated[str | None, typer.Option(help="WAL durability: always or interval")] = None,
    start_timeout: Annotated[
        float | None,
        typer.Option(
            "--start-timeout",
            help="seconds to wait at start for etcd and the object store (0: forever; default 300)",
        ),
    ] = None,
    log_level: Annotated[str | None, typer.Option("--log-level")] = None,
    tls_cert: Annotated[
        Path | None, typer.Option("--tls-cert", help="TLS certificate chain (PEM) for every port")
    ] = None,
    tls_key: Annotated[Path | None, typer.Option("--tls-key", help="TLS private key (PEM)")] = None,
    tls_client_ca: Annotated[
        Path | None, typer.Option("--tls-client-ca", help="mutual TLS: CA that client certificates chain to")
    ] = None,
    auth_jwt_secret_file: Annotated[
        Path | None,
        typer.Option("--auth-jwt-secret-file", help="HS256 secret: turns authentication and RBAC on"),
    ] = None,
    superuser: Annotated[
        list[str] | None, typer.Option("--superuser", help="principal allowed everything (repeatable)")
    ] = None,
) -> None:
    """Run a broker (standalone by default)."""
    from ister.app import run

    try:
        config = load_config(
            config_file,
            {
                "mode": mode,
                "data_dir": str(data_dir) if data_dir else None,
                "broker_addr": broker_addr,
                "advertised_addr": advertised_addr,
                "admin_addr": admin_addr,
                "prom_exporter": prom_exporter,
                "wal.fsync": fsync,
                "start_timeout_seconds": start_timeout,
                "storage.durable.url": durable_url,
                "cluster_name": cluster_name,
                "cluster.zone": zone,
                "cluster.etcd_endpoints": [e.strip() for e in etcd_endpoints.split(",") if e.strip()]
                if etcd_endpoints
                else None,
                "cluster.etcd_tls.ca_file": str(etcd_tls_ca) if etcd_tls_ca else None,
                "cluster.etcd_tls.cert_file": str(etcd_tls_cert) if etcd_tls_cert else None,
                "cluster.etcd_tls.key_file": str(etcd_tls_key) if etcd_tls_key else None,
                "log_level": log_level,
                "security.tls.cert_file": str(tls_cert) if tls_cert else None,
                "security.tls.key_file": str(tls_key) if tls_key else None,
                "security.tls.client_ca_file": str(tls_client_ca) if tls_client_ca else None,
                "security.auth.jwt.secret_file": str(auth_jwt_secret_file) if auth_jwt_secret_file else None,
                "security.superusers": list(superuser) if superuser else None,
            },
            warn=lambda message: typer.echo(f"warning: {message}", err=True),
        )
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        run(config)
    except StartTimeout as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(START_TIMEOUT_EXIT) from None
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except (OSError, IsterError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


def main() -> None:
    sys.exit(app())


import ister.cli.clients  # noqa: E402,F401  (registers `ister produce` and `ister consume`)
from ister.cli import admin as _admin  # noqa: E402,F401  (registers `ister admin`)
from ister.cli import admin_brokers as _admin_brokers  # noqa: E402,F401  (`ister admin brokers ...`)
from ister.cli import admin_cluster as _admin_cluster  # noqa: E402,F401  (`ister admin cluster health`)
from ister.cli import admin_cursors as _admin_cursors  # noqa: E402,F401  (reset-cursor, peek)
from ister.cli import admin_recovery as _admin_recovery  # noqa: E402,F401  (`topics recover`)
from ister.cli import bench as _bench  # noqa: E402,F401  (registers `ister bench`)
from ister.cli import compression as _compression  # noqa: E402,F401  (compression commands of `ister admin`)
from ister.cli import console as _console  # noqa: E402,F401  (registers `ister console`)
from ister.cli import dev as _dev  # noqa: E402,F401  (registers `ister dev`)
from ister.cli import limits as _limits  # noqa: E402,F401  (limit commands of `ister admin`)
from ister.cli import pipeline as _pipeline  # noqa: E402,F401  (registers `ister pipeline`)
from ister.cli import retention as _retention  # noqa: E402,F401  (retention commands of `ister admin`)
from ister.cli import schemas as _schemas  # noqa: E402,F401  (registers `ister admin schemas`)
from ister.cli import security as _security  # noqa: E402,F401  (registers `ister admin security`)
from ister.cli import stats as _stats  # noqa: E402,F401  (`ister admin topics stats`, `subscriptions list`)
from ister.cli import table_drop as _table_drop  # noqa: E402,F401  (drop-table, namespaces tables)
from ister.cli import tables as _tables  # noqa: E402,F401  (`ister table`, set-table of `ister admin`)
