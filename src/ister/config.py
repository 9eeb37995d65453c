"""Configuration: defaults < YAML file < ISTER_* environment < command-line flags, validated once.

The result is a tree of frozen msgspec Structs. Environment variables name nested keys with double
underscores: ISTER_WAL__FSYNC=interval sets `wal.fsync`; values are parsed as YAML scalars. An ISTER_*
variable that names no setting (a script's own ISTER_REPO, say) is ignored with a warning; an invalid value
is an error that names the variable it came from.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import msgspec
import yaml

from ister.config_checks import check
from ister.config_checks import split_host_port as split_host_port  # re-exported: callers use it from here
from ister.errors import ConfigError
from ister.limits import (
    DEFAULT_MAX_MESSAGE_SIZE,
    DEFAULT_METRICS_MAX_TOPICS,
    DEFAULT_WINDOW,
    GiB,
    MiB,
)
from ister.wal_settings import WalSettings

ENV_PREFIX = "ISTER_"
# Variables of the `ister` commands, not of the broker (`ister dev env` exports the first two): a shell that
# has them set starts a broker without a warning about them.
CLI_VARIABLES = frozenset(
    {"ISTER_SERVICE_ADDR", "ISTER_DEV_DIR", "ISTER_TOKEN", "ISTER_API_KEY", "ISTER_TLS_CA"}
)

log = logging.getLogger(__name__)


class LimitsSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Broker-wide caps (0 = unlimited)."""

    # Topics loaded on this broker; creating or loading one more is refused with RESOURCE_EXHAUSTED.
    max_topics_per_broker: int = 100_000
    # A publish held by a rate limit (docs/limits.md) waits at most this long for its turn; one that would
    # wait longer is refused with RESOURCE_EXHAUSTED instead.
    max_publish_wait_seconds: float = 10.0


class IdempotenceSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Idempotent producers (docs/idempotence.md): per topic, what the broker remembers of its producers."""

    max_producers: int = 10_000  # producer keys per topic; the least recently used is forgotten first
    window_seconds: float = 3_600.0  # a key idle this long is forgotten (a retry after that is stored again)
    max_batches: int = 64  # batches remembered per key (>= a publish stream's max in-flight batches)
    scan_max_records: int = 1_000_000  # a loaded topic rebuilds the table from at most this many records

    def check(self) -> None:
        if not 1 <= self.max_producers <= 1_000_000:
            raise ConfigError("idempotence.max_producers must be in 1..1000000")
        if not 1 <= self.window_seconds <= 7 * 86_400:
            raise ConfigError("idempotence.window_seconds must be in 1..604800")
        if not 64 <= self.max_batches <= 4_096:
            raise ConfigError(
                "idempotence.max_batches must be in 64..4096 (64: a stream's in-flight batches)"
            )
        if not 0 <= self.scan_max_records <= 100_000_000:
            raise ConfigError("idempotence.scan_max_records must be in 0..100000000")


class SchemaSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    # JSON Schema compatibility for subjects that do not choose (docs/schema-registry.md): `danube` reads
    # a writer's data as holding only the properties its schema lists (adding or removing an optional
    # property is compatible); `strict` is the open content model (Confluent's).
    json_compatibility: Literal["danube", "strict"] = "danube"


class DispatchSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    max_unacked_messages: int = DEFAULT_WINDOW
    max_redelivery_count: int = 5
    ack_timeout_ms: int = 30_000
    base_redelivery_delay_ms: int = 1_000
    max_redelivery_delay_ms: int = 60_000
    backoff_strategy: Literal["Exponential", "Fixed"] = "Exponential"
    poison_policy: Literal["DeadLetter", "Drop", "Block"] = "DeadLetter"
    # Failover subscriptions on partitioned topics (partitions spread over consumers, handed off gracefully):
    # wait this long after the last join before moving partitions, and at most this long for a moving
    # partition's delivered messages to be acknowledged (0 allowed for both).
    rebalance_delay_seconds: float = 5.0
    max_handoff_seconds: float = 5.0


class Policies(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Namespace policies written at start for bootstrap namespaces (0 = unlimited), as Danube."""

    max_producers_per_topic: int = 0
    max_subscriptions_per_topic: int = 0
    max_consumers_per_topic: int = 0
    max_consumers_per_subscription: int = 0
    max_publish_rate: int = 0
    max_publish_rate_bytes: int = 0
    max_subscription_dispatch_rate: int = 0
    max_topics_per_namespace: int = 0
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE


class DurableSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The durable tier (object storage) that closed WAL segments are exported to."""

    # `file:///dir`, `s3://bucket/prefix`, `gs://…`, `az://…`, `memory://`; "none" disables the tier.
    # Unset: standalone uses `file://<data_dir>/objects`; cluster mode has no tier unless set (history
    # of a moved topic is then not readable on its new broker).
    url: str | None = None
    options: dict[str, str] = msgspec.field(default_factory=dict)  # obstore options (endpoint, region, …)
    export_interval_seconds: float = 10.0
    segment_max_age_seconds: float = 60.0  # the active WAL segment rotates (becomes exportable) after this
    local_retention_bytes: int = 256 * MiB  # newest WAL bytes kept locally even when exported
    local_retention_seconds: float = 600.0  # WAL files younger than this are kept locally too
    # Also write each exported object's records as `data-<start>-<end>.parquet` in the Spark row layout, so
    # Spark reads history with its own Parquet reader (docs/spark.md). Off by default: it costs the broker
    # a decode of every record once (CPU it would otherwise give to publishers) and needs pyarrow.
    parquet: bool = False


class LoadManagerSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The `load_manager:` block (cluster mode; docs/configuration.md, docs/architecture.md §13).
    `rebalancing` is validated by `ister.core.cluster.rebalance` when the load manager starts."""

    assignment_strategy: Literal["fair", "balanced", "weighted_load"] = "fair"
    load_report_interval_seconds: float = 30.0
    rebalancing: dict[str, Any] = msgspec.field(default_factory=dict)


class RetentionSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """`storage.retention`: how often the limits (namespace and topic policies, docs/retention.md) are
    applied to the reliable topics a broker leads."""

    check_interval_seconds: float = 60.0
    # backlog quota policy producer_hold: how long a publish waits for the backlog to fall under the quota
    producer_hold_seconds: float = 10.0


class TablesSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Topics as Iceberg tables (docs/tables.md): where the catalog and the table files are."""

    # sqlite:///abs/path.db or postgresql://... (a SQL catalog), http(s)://... (a REST catalog); None: a
    # SQLite file beside the data directory (<data_dir>/tables/catalog.db)
    catalog_uri: str | None = None
    # where table files go; None: the durable tier's location + /tables (else <data_dir>/tables/warehouse)
    warehouse: str | None = None
    catalog_properties: dict[str, str] = msgspec.field(default_factory=dict)  # more pyiceberg properties
    snapshot_keep_seconds: float = 3_600.0  # older snapshots expire; files only they name are deleted
    max_commit_records: int = 100_000  # records per commit at most (a backlog is committed in steps)
    # data files no snapshot names (a crash between writing and committing) are deleted once this old (a
    # younger one may be a commit in flight), by a sweep at most this often per table
    orphan_min_age_seconds: float = 86_400.0
    orphan_sweep_interval_seconds: float = 3_600.0
    # the conversion, Parquet writes and catalog calls run in one worker process per broker (off: a thread
    # of the broker, which then shares its interpreter with publishes)
    worker_process: bool = True
    # added to the worker process's niceness (0..19). 0 by default: 10 showed no measured gain, and on a
    # saturated machine a niced worker starves (docs/tables.md)
    worker_nice: int = 0


class StorageSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    durable: DurableSettings = msgspec.field(default_factory=DurableSettings)
    retention: RetentionSettings = msgspec.field(default_factory=RetentionSettings)
    # Headroom of the data disk: publishes are refused (RESOURCE_EXHAUSTED) while it has less free than
    # the smaller of these two; either one 0 turns the check off (storage/diskspace.py).
    min_free_bytes: int = GiB
    min_free_ratio: float = 0.05


class EtcdTlsSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """`cluster.etcd_tls`: TLS to etcd (the one path brokers coordinate through). `ca_file` is the CA that
    etcd's server certificate chains to (required for TLS); `cert_file`/`key_file` are this broker's client
    certificate, for an etcd run with `--client-cert-auth`."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.ca_file or self.cert_file or self.key_file)


class ClusterSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Cluster mode only. A dead broker's registration expires `lease_ttl_seconds` after its last renewal."""

    etcd_endpoints: list[str] = msgspec.field(default_factory=lambda: ["127.0.0.1:2379"])
    etcd_namespace: str = ""  # key prefix inside etcd, to share one etcd between clusters
    etcd_tls: EtcdTlsSettings = msgspec.field(default_factory=EtcdTlsSettings)
    lease_ttl_seconds: int = 5
    offset_reservation: int = 100_000  # offsets an owner reserves per metadata write (see docs/metadata.md)
    # Without a durable tier a superseded WAL (left by a failover) cannot be exported: kept this long in
    # <data_dir>/wal-stale for manual recovery, then deleted. With a tier it is exported, then deleted.
    superseded_wal_retention_seconds: float = 7 * 86_400.0
    # Replicated reliable topics (docs/replication.md): copies of each topic's WAL, the owner (leader)
    # included, capped by the live brokers; a namespace policy may override both. min_insync_replicas 0:
    # a majority of the replicas. Standalone mode keeps one copy whatever this says.
    replication_factor: int = 3
    min_insync_replicas: int = 0
    replica_max_lag_seconds: float = 10.0  # an in-sync follower that has not caught up this long leaves
    # Where this broker runs (a rack, an availability zone): a replicated topic's copies go to as many
    # different zones as it has copies, when brokers of that many zones are there. Empty: no zone.
    zone: str = ""
    # A replica on a broker gone this long (or at once, on a draining one) is replaced by a new follower.
    replica_replace_after_seconds: float = 120.0


class MetricsSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The Prometheus exporter (`prom_exporter` says where it listens)."""

    per_topic: bool = True  # series labelled by topic/subscription; false: broker totals only
    max_topics: int = DEFAULT_METRICS_MAX_TOPICS  # per-topic series for at most this many topics


class TlsFiles(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One port's TLS: certificate chain and key (PEM), and the CA that client certificates must chain to
    (set: mutual TLS, a client without a valid certificate is refused at the handshake)."""

    cert_file: str | None = None
    key_file: str | None = None
    client_ca_file: str | None = None
    enabled: bool = True  # false: this port stays plaintext even when `security.tls` names a certificate


class TlsSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """`security.tls`: the files below serve every port (client, admin, metrics); a port's own section
    overrides any of them. Files are re-read when they change (new connections get the new certificate)."""

    cert_file: str | None = None
    key_file: str | None = None
    client_ca_file: str | None = None
    # The CA other brokers' client-port certificates chain to (replication streams between brokers).
    # Unset: client_ca_file, else the system roots.
    peer_ca_file: str | None = None
    client: TlsFiles = msgspec.field(default_factory=TlsFiles)
    admin: TlsFiles = msgspec.field(default_factory=TlsFiles)
    metrics: TlsFiles = msgspec.field(default_factory=TlsFiles)

    def for_port(self, port: Literal["client", "admin", "metrics"]) -> TlsFiles | None:
        """The effective files of `port`, None when it is plaintext."""
        own: TlsFiles = getattr(self, port)
        if not own.enabled:
            return None
        cert = own.cert_file or self.cert_file
        key = own.key_file or self.key_file
        if not cert or not key:
            return None
        return TlsFiles(
            cert_file=cert, key_file=key, client_ca_file=own.client_ca_file or self.client_ca_file
        )


class JwtSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """`security.auth.jwt`: where the keys that sign tokens come from, and the claims every token must
    carry. Any key source set turns authentication on."""

    secret_file: str | None = None  # HS256 shared secret (the whole file, surrounding whitespace stripped)
    public_key_files: list[str] = msgspec.field(default_factory=list)  # PEM RSA/EC keys: RS256, ES256
    jwks_file: str | None = None  # a JSON Web Key Set file (RSA/EC keys, selected by `kid`)
    issuer: str | None = None  # when set, `iss` must equal it
    audience: str | None = None  # when set, `aud` must contain it
    leeway_seconds: int = 30  # clock skew allowed on exp/nbf
    # The longest lifetime IsterAdmin.CreateToken (`ister admin security tokens create` without
    # --secret-file) gives a token it mints with secret_file.
    max_token_ttl_seconds: int = 86_400

    @property
    def configured(self) -> bool:
        return bool(self.secret_file or self.public_key_files or self.jwks_file)


class ApiKeySettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """`security.auth.api_keys`: keys (IsterAdmin RPCs) exchanged for tokens signed with the HS256 secret."""

    token_ttl_seconds: int = 900  # lifetime of an exchanged token (and the most a client may ask for)


class AuthSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    jwt: JwtSettings = msgspec.field(default_factory=JwtSettings)
    api_keys: ApiKeySettings = msgspec.field(default_factory=ApiKeySettings)
    # A verified client certificate (mutual TLS) identifies its holder: principal = subject CN, else SAN.
    mtls_identities: bool = True


class AuditSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    enabled: bool = True  # one line per admin change and per refused call (logger `ister.audit`)
    max_lines_per_second: int = 50  # beyond that lines are dropped and counted in a summary line


class MetricsAuthSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    bearer_token_file: str | None = None  # scrapes must send `Authorization: Bearer <file contents>`


class SecuritySettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Transport security, authentication and authorization (docs/security.md). Everything off by
    default. Authentication is on when a JWT key source is set, or a port requires client certificates;
    with it on, authorization is default-deny RBAC and `superusers` may do everything."""

    tls: TlsSettings = msgspec.field(default_factory=TlsSettings)
    auth: AuthSettings = msgspec.field(default_factory=AuthSettings)
    superusers: list[str] = msgspec.field(default_factory=list)
    audit: AuditSettings = msgspec.field(default_factory=AuditSettings)
    metrics: MetricsAuthSettings = msgspec.field(default_factory=MetricsAuthSettings)

    @property
    def authentication(self) -> bool:
        """Does every call need a principal (a token or, with mutual TLS, a certificate)?"""
        if self.auth.jwt.configured:
            return True
        return self.auth.mtls_identities and any(
            files is not None and files.client_ca_file
            for files in (self.tls.for_port("client"), self.tls.for_port("admin"))
        )


class BrokerConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    mode: Literal["standalone", "cluster"] = "standalone"
    cluster_name: str = "STANDALONE"
    data_dir: str = "./ister-data"
    broker_addr: str = "127.0.0.1:6650"
    advertised_addr: str | None = None
    admin_addr: str = "127.0.0.1:50051"
    prom_exporter: str | None = "127.0.0.1:9040"
    # How long a starting broker waits for etcd and the object store to answer (ister/startwait.py),
    # retrying with a backoff; then it exits with status 3. 0: wait forever.
    start_timeout_seconds: float = 300.0
    auto_create_topics: bool = True
    bootstrap_namespaces: list[str] = msgspec.field(default_factory=lambda: ["default"])
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    wal: WalSettings = msgspec.field(default_factory=WalSettings)
    tables: TablesSettings = msgspec.field(default_factory=TablesSettings)
    dispatch: DispatchSettings = msgspec.field(default_factory=DispatchSettings)
    policies: Policies = msgspec.field(default_factory=Policies)
    cluster: ClusterSettings = msgspec.field(default_factory=ClusterSettings)
    storage: StorageSettings = msgspec.field(default_factory=StorageSettings)
    load_manager: LoadManagerSettings = msgspec.field(default_factory=LoadManagerSettings)
    metrics: MetricsSettings = msgspec.field(default_factory=MetricsSettings)
    limits: LimitsSettings = msgspec.field(default_factory=LimitsSettings)
    security: SecuritySettings = msgspec.field(default_factory=SecuritySettings)
    schema: SchemaSettings = msgspec.field(default_factory=SchemaSettings)
    idempotence: IdempotenceSettings = msgspec.field(default_factory=IdempotenceSettings)

    def durable_url(self, data_dir: Path) -> str | None:
        """The object store URL in effect (None: no durable tier)."""
        url = self.storage.durable.url
        if url == "none":
            return None
        if url is None:
            return (data_dir / "objects").resolve().as_uri() if self.mode == "standalone" else None
        return url

    @property
    def broker_url(self) -> str:
        """The URL clients are told to connect to (lookup answers): https:// when the client port has TLS."""
        addr = self.advertised_addr or self.broker_addr
        if "://" in addr:
            return addr
        scheme = "https" if self.security.tls.for_port("client") is not None else "http"
        return f"{scheme}://{addr}"


def http_url(addr: str) -> str:
    """An address as a URL (http:// unless it names a scheme)."""
    return addr if "://" in addr else f"http://{addr}"


def _set_path(tree: dict[str, Any], path: list[str], value: Any) -> None:
    node = tree
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{'.'.join(path)}: {part} is not a section")
        node = child
    node[path[-1]] = value


def _setting_path(path: list[str]) -> bool:
    """Does `path` name a setting (or a key inside a free-form mapping setting such as storage options)?"""
    info: msgspec.inspect.Type = msgspec.inspect.type_info(BrokerConfig)
    for i, part in enumerate(path):
        if isinstance(info, msgspec.inspect.UnionType):  # `X | None`: look through the None
            kinds = [t for t in info.types if not isinstance(t, msgspec.inspect.NoneType)]
            info = kinds[0] if len(kinds) == 1 else info
        if isinstance(info, msgspec.inspect.DictType):
            return True  # any key below a mapping setting is the user's
        if not isinstance(info, msgspec.inspect.StructType):
            return False  # a part below a plain value (ISTER_LOG_LEVEL__X)
        field = next((f for f in info.fields if f.encode_name == part), None)
        if field is None:
            return False
        info = field.type
        if i == len(path) - 1:
            return True
    return False


def _env_overrides(
    environ: Mapping[str, str], origins: dict[tuple[str, ...], str], warn: Callable[[str], None]
) -> dict[str, Any]:
    """The ISTER_* variables that name settings, as a tree; `origins` maps each key path to its variable."""
    tree: dict[str, Any] = {}
    for name, raw in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX) or name in CLI_VARIABLES:
            continue
        path = [p.lower() for p in name[len(ENV_PREFIX) :].split("__")]
        if not all(path) or not _setting_path(path):
            warn(f"ignoring environment variable {name}: no setting is named {'.'.join(path)!r}")
            continue
        try:
            value = yaml.safe_load(raw) if raw != "" else None
        except yaml.YAMLError as exc:
            raise ConfigError(f"environment {name}: {exc}") from None
        try:
            _set_path(tree, path, value)
        except ConfigError as exc:
            raise ConfigError(f"environment {name}: {exc}") from None
        origins[tuple(path)] = f"environment variable {name}"
    return tree


_ERROR_PATH = re.compile(r"at `\$((?:\.[A-Za-z0-9_]+|\[\d+\])*)`")


def _origin_of(message: str, origins: Mapping[tuple[str, ...], str]) -> str | None:
    """Where the value a msgspec error points at (``at `$.wal.fsync` ``) came from, if known."""
    match = _ERROR_PATH.search(message)
    if match is None:
        return None
    path = tuple(re.findall(r"\.([A-Za-z0-9_]+)", match.group(1)))
    for n in range(len(path), 0, -1):  # the longest given prefix: a mapping value set as a whole
        origin = origins.get(path[:n])
        if origin is not None:
            return origin
    return None


def _record_origins(
    tree: Mapping[str, Any], origin: str, out: dict[tuple[str, ...], str], at: tuple[str, ...] = ()
) -> None:
    for key, value in tree.items():
        path = (*at, str(key))
        out[path] = origin
        if isinstance(value, Mapping):
            _record_origins(value, origin, out, path)


def _merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def load_config(
    config_file: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    warn: Callable[[str], None] | None = None,
) -> BrokerConfig:
    """Build the validated configuration. `overrides` are flag values (dotted keys allowed, None = unset).

    `warn` receives what is ignored (ISTER_* variables that name no setting); by default it is logged.
    """
    warn = warn or log.warning
    origins: dict[tuple[str, ...], str] = {}
    tree: dict[str, Any] = {}
    if config_file is not None:
        try:
            loaded = yaml.safe_load(config_file.read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read config file {config_file}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {config_file} is not valid YAML: {exc}") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {config_file} must hold a mapping at the top level")
        tree = loaded
        _record_origins(tree, f"config file {config_file}", origins)
    tree = _merge(tree, _env_overrides(os.environ if environ is None else environ, origins, warn))
    flags: dict[str, Any] = {}
    for key, value in (overrides or {}).items():
        if value is not None:
            _set_path(flags, key.split("."), value)
            origins[tuple(key.split("."))] = "the command line"
    tree = _merge(tree, flags)
    try:
        cfg = msgspec.convert(tree, BrokerConfig, strict=False)
    except msgspec.ValidationError as exc:
        origin = _origin_of(str(exc), origins)
        where = f" (from {origin})" if origin is not None else ""
        raise ConfigError(f"invalid configuration: {exc}{where}") from None
    try:
        return check(cfg)
    except ConfigError as exc:
        # "dispatch.ack_timeout_ms must be > 0", "broker_addr: expected HOST:PORT, …": name the source.
        found = re.match(r"[a-z_]+(?:\.[a-z_]+)*", str(exc))
        origin = origins.get(tuple(found.group(0).split("."))) if found is not None else None
        if origin is None:
            raise
        raise ConfigError(f"{exc} (from {origin})") from None
