"""The Iceberg catalog a broker commits topics' tables to (docs/tables.md, "Catalogs").

Standalone default: an embedded SQL catalog in a SQLite file beside the data directory; tables' files go
to the durable tier's location (a local directory or S3) under `tables/`. A cluster names a shared catalog
in `tables.catalog_uri`: sqlite:///... or postgresql://... (pyiceberg's SQL catalog, PostgreSQL through
psycopg2) or http(s)://... (a REST catalog). An Ister namespace is an Iceberg namespace; a topic (each
partition of a partitioned topic) is a table of the same name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ister.config import BrokerConfig
from ister.config_checks import catalog_uri_problem
from ister.errors import InvalidArgument
from ister.ids import TopicName, shown

CATALOG_NAME = "ister"
# obstore option names (without an `aws_` prefix) -> pyiceberg's S3 properties
_S3_PROPERTIES = {
    "endpoint": "s3.endpoint",
    "endpoint_url": "s3.endpoint",
    "access_key_id": "s3.access-key-id",
    "access_key": "s3.access-key-id",
    "secret_access_key": "s3.secret-access-key",
    "secret_key": "s3.secret-access-key",
    "region": "s3.region",
    "token": "s3.session-token",
    "session_token": "s3.session-token",
}
SECRET_PROPERTIES = ("s3.secret-access-key", "s3.session-token", "credential", "token")


@dataclass(frozen=True)
class CatalogSpec:
    """How to reach the catalog: its URI, the warehouse, and more pyiceberg properties."""

    uri: str
    warehouse: str
    properties: dict[str, str] = field(default_factory=dict)

    def load_properties(self) -> dict[str, str]:
        return {"uri": self.uri, "warehouse": self.warehouse, **self.properties}

    def public_uri(self) -> str:
        """The URI without a password (`ister table` prints it; libpq takes one from PGPASSWORD or
        ~/.pgpass)."""
        scheme, sep, rest = self.uri.partition("://")
        if not scheme.startswith("postgresql") or "@" not in rest.split("/", 1)[0]:
            return self.uri
        userinfo, at, hostpart = rest.partition("@")
        return f"{scheme}{sep}{userinfo.split(':', 1)[0]}{at}{hostpart}"

    def public_properties(self) -> dict[str, str]:
        """The properties a reader needs, secrets left out (`ister table` prints these)."""
        return {k: v for k, v in self.properties.items() if k not in SECRET_PROPERTIES}


def check_uri(uri: str) -> str:
    """`uri` as the broker opens it: postgresql:// names its driver, psycopg2 (config_checks.py says why)."""
    problem = catalog_uri_problem(uri)
    if problem is not None:
        raise InvalidArgument(f"tables.catalog_uri {shown(uri)}: {problem}")
    if uri.startswith("postgresql://"):
        return "postgresql+psycopg2://" + uri.removeprefix("postgresql://")
    return uri


def spec_for(config: BrokerConfig, data_dir: Path) -> CatalogSpec:
    """The catalog this broker's configuration names (defaults as the module says)."""
    t = config.tables
    root = (data_dir / "tables").resolve()
    uri = check_uri(t.catalog_uri) if t.catalog_uri else f"sqlite:///{root / 'catalog.db'}"
    properties: dict[str, str] = {}
    durable = config.durable_url(data_dir)
    if t.warehouse:
        warehouse = t.warehouse
    elif durable is not None:
        warehouse = durable.rstrip("/") + "/tables"
    else:
        warehouse = (root / "warehouse").as_uri()
    if warehouse.startswith("s3://"):
        for key, value in config.storage.durable.options.items():
            name = _S3_PROPERTIES.get(key.lower().removeprefix("aws_"))
            if name is not None:
                properties[name] = value
    if uri.startswith("postgresql"):
        # a pooled connection dies with a server restart or failover: tested before use, the first commit
        # after one does not fail on it (pyiceberg's default is off)
        properties["pool_pre_ping"] = "true"
    properties.update(t.catalog_properties)
    return CatalogSpec(uri, warehouse, properties)


def table_ident(name: TopicName) -> tuple[str, str]:
    """(namespace, table) of a topic's table: a partition's table is named like the partition."""
    return (name.namespace, name.topic)


def open_catalog(spec: CatalogSpec) -> Any:
    """A pyiceberg catalog (blocking: call from a thread). Creates the SQLite file's directory."""
    from pyiceberg.catalog import load_catalog

    if spec.uri.startswith("sqlite:///"):
        Path(spec.uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    if spec.warehouse.startswith("file://"):
        Path(spec.warehouse.removeprefix("file://")).mkdir(parents=True, exist_ok=True)
    return load_catalog(CATALOG_NAME, **spec.load_properties())


__all__ = ["CATALOG_NAME", "CatalogSpec", "check_uri", "open_catalog", "spec_for", "table_ident"]
