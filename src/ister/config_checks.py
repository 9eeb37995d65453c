"""The broker configuration's rules: every range and cross-field check, section by section, run once
when the configuration is loaded (`config.load_config`). The WAL's are `storage/wal/config.py`'s."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ister.errors import ConfigError, InvalidArgument
from ister.ids import validate_segment
from ister.limits import GRPC_MAX_MESSAGE_BYTES, MAX_METRICS_TOPICS, MAX_WINDOW, MIN_WINDOW, MiB

if TYPE_CHECKING:
    from ister.config import (
        BrokerConfig,
        ClusterSettings,
        DispatchSettings,
        Policies,
        SecuritySettings,
        StorageSettings,
        TlsFiles,
    )

MAX_POLICY_MESSAGE_SIZE = GRPC_MAX_MESSAGE_BYTES - MiB  # room for the envelope around the payload


def check(cfg: BrokerConfig) -> BrokerConfig:
    """Every cross-field and range rule, section by section, in a fixed order (the first broken rule is
    the error)."""
    _check_addresses(cfg)
    if not 0 <= cfg.start_timeout_seconds <= 7 * 86_400:
        raise ConfigError("start_timeout_seconds must be in 0..604800 (0 = wait forever)")
    _check_dispatch_lower_bounds(cfg.dispatch)
    cfg.wal.check()
    if cfg.limits.max_topics_per_broker < 0:
        raise ConfigError("limits.max_topics_per_broker must be >= 0 (0 = unlimited)")
    if not 0 <= cfg.limits.max_publish_wait_seconds <= 3_600:
        raise ConfigError("limits.max_publish_wait_seconds must be in 0..3600")
    d = cfg.dispatch
    if d.base_redelivery_delay_ms > d.max_redelivery_delay_ms:
        raise ConfigError("dispatch.base_redelivery_delay_ms must be <= dispatch.max_redelivery_delay_ms")
    _check_policies(cfg.policies)
    _check_names(cfg)
    _check_durable(cfg)
    if not 0.1 <= cfg.storage.retention.check_interval_seconds <= 86_400:
        raise ConfigError("storage.retention.check_interval_seconds must be in 0.1..86400")
    if not 0 <= cfg.storage.retention.producer_hold_seconds <= 60:
        raise ConfigError("storage.retention.producer_hold_seconds must be in 0..60")
    _check_headroom(cfg.storage)
    if not 0.1 <= cfg.load_manager.load_report_interval_seconds <= 3600:
        raise ConfigError("load_manager.load_report_interval_seconds must be in 0.1..3600")
    if not 0 <= cfg.metrics.max_topics <= MAX_METRICS_TOPICS:
        raise ConfigError(f"metrics.max_topics must be in 0..{MAX_METRICS_TOPICS}")
    _check_cluster(cfg.cluster)
    _check_dispatch_upper_bounds(d)
    _check_security(cfg.security)
    cfg.idempotence.check()
    _check_tables(cfg)
    return cfg


# The catalog URIs a broker opens: pyiceberg's SQL catalog on SQLite or on PostgreSQL through psycopg2 (the
# driver pyiceberg's sql-postgres extra installs; SQLAlchemy 2.1 reads a bare postgresql:// as psycopg 3,
# which Ister does not ship, so the broker names the driver: catalog.py), or a REST catalog.
CATALOG_SCHEMES = ("sqlite:///", "postgresql://", "postgresql+psycopg2://", "http://", "https://")


def catalog_uri_problem(uri: str) -> str | None:
    """Why `uri` is not a catalog URI a broker can open, or None."""
    if uri.startswith(CATALOG_SCHEMES):
        return None
    if uri.startswith("postgresql+"):
        return (
            f"{uri.split('://', 1)[0]}: the PostgreSQL driver shipped is psycopg2 (postgresql+psycopg2://...)"
        )
    return "expected sqlite:///path, postgresql://user@host:port/db or http(s)://..."


def _check_tables(cfg: BrokerConfig) -> None:
    t = cfg.tables
    problem = catalog_uri_problem(t.catalog_uri) if t.catalog_uri is not None else None
    if problem is not None:
        raise ConfigError(f"tables.catalog_uri: {problem}")
    if t.orphan_min_age_seconds < 0 or t.orphan_sweep_interval_seconds <= 0:
        raise ConfigError("tables: orphan_min_age_seconds must be >= 0 and orphan_sweep_interval_seconds > 0")
    if t.snapshot_keep_seconds < 0 or t.max_commit_records < 1:
        raise ConfigError("tables: snapshot_keep_seconds must be >= 0 and max_commit_records >= 1")
    if not 0 <= t.worker_nice <= 19:
        raise ConfigError(f"tables.worker_nice: expected 0 to 19, got {t.worker_nice}")


def _check_security(sec: SecuritySettings) -> None:
    tls = sec.tls
    if bool(tls.cert_file) != bool(tls.key_file):
        raise ConfigError("security.tls: cert_file and key_file go together (--tls-cert and --tls-key)")
    if tls.client_ca_file and not tls.cert_file:
        raise ConfigError("security.tls.client_ca_file needs a server certificate (--tls-cert, --tls-key)")
    for port in ("client", "admin", "metrics"):
        own: TlsFiles = getattr(tls, port)
        if own.enabled and bool(own.cert_file or tls.cert_file) != bool(own.key_file or tls.key_file):
            raise ConfigError(f"security.tls.{port}: cert_file and key_file go together")
    files = [
        f
        for f in (
            tls.cert_file,
            tls.key_file,
            tls.client_ca_file,
            sec.auth.jwt.secret_file,
            sec.auth.jwt.jwks_file,
            sec.metrics.bearer_token_file,
            *sec.auth.jwt.public_key_files,
            *(getattr(getattr(tls, p), k) for p in ("client", "admin", "metrics") for k in TLS_FILE_KEYS),
        )
        if f
    ]
    for path in files:
        if not Path(path).is_file():
            raise ConfigError(f"security: file {path} does not exist or is not a file")
    if not 0 <= sec.auth.jwt.leeway_seconds <= 3600:
        raise ConfigError("security.auth.jwt.leeway_seconds must be in 0..3600")
    if not 1 <= sec.auth.jwt.max_token_ttl_seconds <= 366 * 86_400:
        raise ConfigError("security.auth.jwt.max_token_ttl_seconds must be in 1..31622400 (366 days)")
    if not 1 <= sec.auth.api_keys.token_ttl_seconds <= 86_400:
        raise ConfigError("security.auth.api_keys.token_ttl_seconds must be in 1..86400")
    if sec.audit.max_lines_per_second < 1:
        raise ConfigError("security.audit.max_lines_per_second must be >= 1")


TLS_FILE_KEYS = ("cert_file", "key_file", "client_ca_file")


def _check_addresses(cfg: BrokerConfig) -> None:
    for field, value in (("broker_addr", cfg.broker_addr), ("admin_addr", cfg.admin_addr)):
        split_host_port(value, field)
    if cfg.prom_exporter:
        split_host_port(cfg.prom_exporter, "prom_exporter")


def _check_dispatch_lower_bounds(d: DispatchSettings) -> None:
    if not MIN_WINDOW <= d.max_unacked_messages <= MAX_WINDOW:
        raise ConfigError(f"dispatch.max_unacked_messages must be in {MIN_WINDOW}..{MAX_WINDOW}")
    for name in (
        "max_redelivery_count",
        "ack_timeout_ms",
        "base_redelivery_delay_ms",
        "max_redelivery_delay_ms",
        "rebalance_delay_seconds",
        "max_handoff_seconds",
    ):
        if getattr(d, name) < 0:
            raise ConfigError(f"dispatch.{name} must be >= 0")
    if d.ack_timeout_ms == 0:
        raise ConfigError("dispatch.ack_timeout_ms must be > 0")


def _check_dispatch_upper_bounds(d: DispatchSettings) -> None:
    if d.max_redelivery_count > 1_000:
        raise ConfigError("dispatch.max_redelivery_count must be <= 1000")
    for name in ("ack_timeout_ms", "base_redelivery_delay_ms", "max_redelivery_delay_ms"):
        if getattr(d, name) > 86_400_000:
            raise ConfigError(f"dispatch.{name} must be <= 86400000 (one day)")
    for name in ("rebalance_delay_seconds", "max_handoff_seconds"):
        if getattr(d, name) > 3_600:
            raise ConfigError(f"dispatch.{name} must be <= 3600")


def _check_policies(policies: Policies) -> None:
    if policies.max_message_size > MAX_POLICY_MESSAGE_SIZE:
        raise ConfigError(f"policies.max_message_size must be <= {MAX_POLICY_MESSAGE_SIZE} (gRPC's limit)")
    for name in type(policies).__struct_fields__:
        if getattr(policies, name) < 0:
            raise ConfigError(f"policies.{name} must be >= 0")


def _check_names(cfg: BrokerConfig) -> None:
    if not cfg.bootstrap_namespaces:
        raise ConfigError("bootstrap_namespaces must not be empty")
    for ns in [*cfg.bootstrap_namespaces, cfg.cluster_name]:
        try:
            validate_segment(ns, "name")
        except InvalidArgument as exc:
            raise ConfigError(f"bootstrap_namespaces/cluster_name: {exc}") from None


def _check_durable(cfg: BrokerConfig) -> None:
    dur = cfg.storage.durable
    if dur.export_interval_seconds <= 0 or dur.segment_max_age_seconds < 0:
        raise ConfigError("storage.durable: export_interval_seconds > 0, segment_max_age_seconds >= 0")
    if not 1 <= cfg.cluster.replication_factor <= 5:
        raise ConfigError("cluster.replication_factor must be in 1..5")
    if not 0 <= cfg.cluster.min_insync_replicas <= cfg.cluster.replication_factor:
        raise ConfigError("cluster.min_insync_replicas must be in 0..replication_factor (0: a majority)")
    if cfg.cluster.replica_max_lag_seconds <= 0:
        raise ConfigError("cluster.replica_max_lag_seconds must be > 0")
    if cfg.cluster.replica_replace_after_seconds <= 0:
        raise ConfigError("cluster.replica_replace_after_seconds must be > 0")
    if cfg.cluster.superseded_wal_retention_seconds < 0:
        raise ConfigError("cluster.superseded_wal_retention_seconds must be >= 0")
    if dur.local_retention_bytes < 0 or dur.local_retention_seconds < 0:
        raise ConfigError("storage.durable: local retention limits must be >= 0")
    if dur.url is not None and dur.url != "none" and "://" not in dur.url:
        raise ConfigError(f"storage.durable.url: expected a URL like s3://bucket/prefix, got {dur.url!r}")


def _check_headroom(s: StorageSettings) -> None:
    if s.min_free_bytes < 0:
        raise ConfigError("storage.min_free_bytes must be >= 0 (0 = no headroom check)")
    if not 0 <= s.min_free_ratio <= 1:
        raise ConfigError("storage.min_free_ratio must be in 0..1 (0 = no headroom check)")


def _check_cluster(c: ClusterSettings) -> None:
    if not c.etcd_endpoints:
        raise ConfigError("cluster.etcd_endpoints must not be empty")
    for endpoint in c.etcd_endpoints:
        split_host_port(endpoint.split("://", 1)[-1], "cluster.etcd_endpoints")
    _check_etcd_tls(c)
    if not 2 <= c.lease_ttl_seconds <= 60:
        raise ConfigError("cluster.lease_ttl_seconds must be in 2..60")
    if not 1_000 <= c.offset_reservation <= 100_000_000:
        raise ConfigError("cluster.offset_reservation must be in 1000..100000000")
    if c.etcd_namespace and (not c.etcd_namespace.startswith("/") or c.etcd_namespace.endswith("/")):
        raise ConfigError("cluster.etcd_namespace must start with '/' and not end with '/' (e.g. /prod)")


def _check_etcd_tls(c: ClusterSettings) -> None:
    """TLS to etcd: every endpoint `https://` (or bare HOST:PORT) with a CA, or none; files that exist."""
    tls = c.etcd_tls
    schemes = {e.split("://", 1)[0].lower() for e in c.etcd_endpoints if "://" in e}
    if schemes - {"http", "https"}:
        raise ConfigError("cluster.etcd_endpoints: use HOST:PORT, http://HOST:PORT or https://HOST:PORT")
    if "https" in schemes and not tls.ca_file:
        raise ConfigError(
            "cluster.etcd_endpoints has https:// endpoints but cluster.etcd_tls.ca_file is not set "
            "(the CA that etcd's server certificate chains to)"
        )
    if tls.enabled and "http" in schemes:
        raise ConfigError(
            "cluster.etcd_tls is set but cluster.etcd_endpoints has http:// (plaintext) endpoints: "
            "use https://HOST:PORT or HOST:PORT"
        )
    if (tls.cert_file or tls.key_file) and not tls.ca_file:
        raise ConfigError("cluster.etcd_tls: a client certificate needs ca_file (etcd's CA) as well")
    if bool(tls.cert_file) != bool(tls.key_file):
        raise ConfigError("cluster.etcd_tls: cert_file and key_file go together")
    for key in TLS_ETCD_KEYS:
        path = getattr(tls, key)
        if path and not Path(path).is_file():
            raise ConfigError(f"cluster.etcd_tls.{key}: file {path} does not exist or is not a file")


TLS_ETCD_KEYS = ("ca_file", "cert_file", "key_file")


def split_host_port(value: str, what: str = "address") -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not (port.isascii() and port.isdigit()) or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{what}: expected HOST:PORT, got {value!r}")
    return host, int(port)
