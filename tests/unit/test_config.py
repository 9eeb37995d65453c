"""Configuration: defaults < YAML file < ISTER_* environment < flags, validated once, errors name the key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ister.config import BrokerConfig, load_config, split_host_port
from ister.errors import ConfigError
from ister.limits import DEFAULT_MAX_MESSAGE_SIZE, DEFAULT_WINDOW, MAX_WINDOW, MIN_WINDOW


def _load(
    tmp_path: Path | None = None,
    yaml_text: str | None = None,
    flags: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
) -> BrokerConfig:
    path = None
    if yaml_text is not None:
        assert tmp_path is not None
        path = tmp_path / "ister.yml"
        path.write_text(yaml_text)
    return load_config(path, flags, {} if env is None else env)


# -- defaults ------------------------------------------------------------------------------------------------


def test_defaults_follow_danube() -> None:
    cfg = _load()
    assert cfg.mode == "standalone"
    assert cfg.broker_addr == "127.0.0.1:6650"
    assert cfg.admin_addr == "127.0.0.1:50051"
    assert cfg.prom_exporter == "127.0.0.1:9040"
    assert cfg.bootstrap_namespaces == ["default"]
    assert cfg.auto_create_topics is True
    assert cfg.broker_url == "http://127.0.0.1:6650"
    assert cfg.wal.fsync == "always"
    d = cfg.dispatch
    assert d.max_unacked_messages == DEFAULT_WINDOW == 10
    assert d.max_redelivery_count == 5
    assert d.ack_timeout_ms == 30_000
    assert cfg.policies.max_message_size == DEFAULT_MAX_MESSAGE_SIZE == 10 * 1024 * 1024


def test_default_environ_is_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ISTER_WAL__FSYNC", "interval")
    assert load_config().wal.fsync == "interval"


def test_unrelated_environment_ignored() -> None:
    cfg = _load(env={"HOME": "/root", "ISTERX": "1", "PATH": "/bin", "XISTER_MODE": "cluster"})
    assert cfg == _load()


def test_advertised_addr_is_broker_url() -> None:
    assert _load(flags={"advertised_addr": "broker.example:7000"}).broker_url == "http://broker.example:7000"
    assert _load(flags={"advertised_addr": "https://b:1"}).broker_url == "https://b:1"


# -- sources and precedence ----------------------------------------------------------------------------------


def test_yaml_file(tmp_path: Path) -> None:
    cfg = _load(
        tmp_path,
        "broker_addr: 0.0.0.0:7000\n"
        "prom_exporter: null\n"
        "bootstrap_namespaces: [default, tenant_a]\n"
        "wal: {fsync: interval, fsync_interval_ms: 20}\n"
        "dispatch:\n  max_unacked_messages: 100\n  poison_policy: Drop\n",
    )
    assert cfg.broker_addr == "0.0.0.0:7000"
    assert cfg.prom_exporter is None
    assert cfg.bootstrap_namespaces == ["default", "tenant_a"]
    assert cfg.wal.fsync == "interval"
    assert cfg.wal.fsync_interval_ms == 20
    assert cfg.wal.segment_max_bytes == BrokerConfig().wal.segment_max_bytes  # untouched keys keep defaults
    assert cfg.dispatch.max_unacked_messages == 100
    assert cfg.dispatch.poison_policy == "Drop"
    assert cfg.dispatch.ack_timeout_ms == 30_000


def test_empty_yaml_file_means_defaults(tmp_path: Path) -> None:
    assert _load(tmp_path, "") == _load()
    assert _load(tmp_path, "# only a comment\n") == _load()


def test_nested_env_override() -> None:
    cfg = _load(env={"ISTER_WAL__FSYNC": "interval", "ISTER_DISPATCH__MAX_UNACKED_MESSAGES": "25"})
    assert cfg.wal.fsync == "interval"
    assert cfg.dispatch.max_unacked_messages == 25  # env values are YAML scalars


def test_env_name_is_case_insensitive_after_prefix() -> None:
    assert _load(env={"ISTER_wal__Fsync": "interval"}).wal.fsync == "interval"


def test_env_overrides_yaml_but_keeps_sibling_keys(tmp_path: Path) -> None:
    cfg = _load(
        tmp_path,
        "wal: {fsync: always, fsync_interval_ms: 7}\nlog_level: debug\n",
        env={"ISTER_WAL__FSYNC": "interval"},
    )
    assert cfg.wal.fsync == "interval"
    assert cfg.wal.fsync_interval_ms == 7  # the merge is per key, not per section
    assert cfg.log_level == "debug"


def test_env_empty_value_unsets_optional() -> None:
    assert _load(env={"ISTER_PROM_EXPORTER": ""}).prom_exporter is None


def test_env_list_value() -> None:
    assert _load(env={"ISTER_BOOTSTRAP_NAMESPACES": "[a, b]"}).bootstrap_namespaces == ["a", "b"]


def test_flags_override_env_and_yaml(tmp_path: Path) -> None:
    cfg = _load(
        tmp_path,
        "broker_addr: 127.0.0.1:1000\nwal: {fsync: interval}\n",
        flags={"broker_addr": "127.0.0.1:3000", "wal.fsync": "always"},
        env={"ISTER_BROKER_ADDR": "127.0.0.1:2000", "ISTER_WAL__FSYNC": "interval"},
    )
    assert cfg.broker_addr == "127.0.0.1:3000"
    assert cfg.wal.fsync == "always"


def test_unset_flags_do_not_override(tmp_path: Path) -> None:
    cfg = _load(
        tmp_path,
        "log_level: warning\n",
        flags={"log_level": None, "wal.fsync": None},
        env={"ISTER_WAL__FSYNC": "interval"},
    )
    assert cfg.log_level == "warning"
    assert cfg.wal.fsync == "interval"


# -- invalid input: ConfigError naming the key ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "key"),
    [
        ({"dispatch.max_unacked_messages": MIN_WINDOW - 1}, "max_unacked_messages"),
        ({"dispatch.max_unacked_messages": MAX_WINDOW + 1}, "max_unacked_messages"),
        ({"dispatch.max_unacked_messages": "ten"}, "max_unacked_messages"),
        ({"dispatch.max_unacked_messages": True}, "max_unacked_messages"),
        ({"dispatch.max_unacked_messages": 10.5}, "max_unacked_messages"),
        ({"dispatch.ack_timeout_ms": 0}, "ack_timeout_ms"),
        ({"dispatch.max_redelivery_count": -1}, "max_redelivery_count"),
        ({"dispatch.base_redelivery_delay_ms": -1}, "base_redelivery_delay_ms"),
        ({"dispatch.backoff_strategy": "Linear"}, "backoff_strategy"),
        ({"dispatch.poison_policy": "Ignore"}, "poison_policy"),
        ({"wal.fsync": "sometimes"}, "fsync"),
        ({"wal.segment_max_bytes": 5}, "segment_max_bytes"),
        ({"wal.fsync_interval_ms": 0}, "fsync_interval_ms"),
        ({"policies.max_message_size": -1}, "max_message_size"),
        ({"mode": "galaxy"}, "mode"),
        ({"log_level": "verbose"}, "log_level"),
        ({"auto_create_topics": "perhaps"}, "auto_create_topics"),
        ({"broker_addr": 6650}, "broker_addr"),
        ({"bootstrap_namespaces": []}, "bootstrap_namespaces"),
        ({"tables.worker_nice": 20}, "worker_nice"),
        ({"tables.worker_nice": -1}, "worker_nice"),
    ],
)
def test_invalid_values_name_the_key(flags: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        _load(flags=flags)


def test_table_worker_nice_defaults_to_0() -> None:
    assert _load().tables.worker_nice == 0
    assert _load(flags={"tables.worker_nice": 10}).tables.worker_nice == 10


def test_window_bounds_are_inclusive() -> None:
    assert _load(flags={"dispatch.max_unacked_messages": MIN_WINDOW}).dispatch.max_unacked_messages == 1
    assert _load(flags={"dispatch.max_unacked_messages": MAX_WINDOW}).dispatch.max_unacked_messages == 10_000


def test_invalid_env_value_names_the_key() -> None:
    with pytest.raises(ConfigError, match="max_unacked_messages"):
        _load(env={"ISTER_DISPATCH__MAX_UNACKED_MESSAGES": "0"})
    with pytest.raises(ConfigError, match="ISTER_WAL__FSYNC"):
        _load(env={"ISTER_WAL__FSYNC": "[unclosed"})  # not even YAML: the variable is named


@pytest.mark.parametrize(
    ("yaml_text", "key"),
    [
        ("bogus: 1\n", "bogus"),
        ("wal: {fsynk: always}\n", "fsynk"),
        ("dispatch: {window: 5}\n", "window"),
        ("policies: {max_things: 1}\n", "max_things"),
    ],
)
def test_unknown_keys_rejected(tmp_path: Path, yaml_text: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        _load(tmp_path, yaml_text)


def test_env_variables_naming_no_setting_are_ignored_with_a_warning() -> None:
    """A script's own ISTER_REPO (or a typo) does not stop the broker; the warning names the variable."""
    warnings: list[str] = []
    env = {
        "ISTER_REPO": "/src/ister",
        "ISTER_WAL__NOPE": "1",
        "ISTER_LOG_LEVEL__X": "1",  # below a plain value
        "ISTER_CONFIG_FILE": "x.yml",
        "ISTER_WAL__FSYNC": "interval",
        # The `ister` commands' own variables (`ister dev env` exports these): no warning.
        "ISTER_SERVICE_ADDR": "http://127.0.0.1:6650",
        "ISTER_DEV_DIR": ".ister-dev",
        "ISTER_TOKEN": "t",
    }
    cfg = load_config(None, None, env, warn=warnings.append)
    assert cfg.wal.fsync == "interval"
    assert sorted(warnings) == [
        "ignoring environment variable ISTER_CONFIG_FILE: no setting is named 'config_file'",
        "ignoring environment variable ISTER_LOG_LEVEL__X: no setting is named 'log_level.x'",
        "ignoring environment variable ISTER_REPO: no setting is named 'repo'",
        "ignoring environment variable ISTER_WAL__NOPE: no setting is named 'wal.nope'",
    ]


def test_env_warnings_are_logged_by_default(caplog: pytest.LogCaptureFixture) -> None:
    _load(env={"ISTER_REPO": "x"})
    assert "ISTER_REPO" in caplog.text


def test_env_keys_below_a_mapping_setting_are_the_users() -> None:
    warnings: list[str] = []
    env = {"ISTER_STORAGE__DURABLE__OPTIONS__ENDPOINT": "http://127.0.0.1:8333"}
    cfg = load_config(None, None, env, warn=warnings.append)
    assert cfg.storage.durable.options == {"endpoint": "http://127.0.0.1:8333"}
    assert warnings == []


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"ISTER_WAL__FSYNC": "never"}, "`$.wal.fsync` (from environment variable ISTER_WAL__FSYNC)"),
        (
            {"ISTER_DISPATCH__ACK_TIMEOUT_MS": "soon"},
            "(from environment variable ISTER_DISPATCH__ACK_TIMEOUT_MS)",
        ),
        (
            {"ISTER_DISPATCH__ACK_TIMEOUT_MS": "0"},
            "must be > 0 (from environment variable ISTER_DISPATCH__ACK_",
        ),
        (
            {"ISTER_BROKER_ADDR": "nohost"},
            "HOST:PORT, got 'nohost' (from environment variable ISTER_BROKER_ADDR)",
        ),
        ({"ISTER_WAL": "fast"}, "`$.wal` (from environment variable ISTER_WAL)"),
        (
            {"ISTER_WAL": "fast", "ISTER_WAL__FSYNC": "always"},
            "environment ISTER_WAL__FSYNC: wal.fsync: wal is",
        ),
        (
            {"ISTER_STORAGE__DURABLE__OPTIONS": "[1]"},
            "(from environment variable ISTER_STORAGE__DURABLE__OPTIONS)",
        ),
    ],
)
def test_invalid_env_values_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        _load(env=env)
    assert message in str(info.value)


def test_invalid_values_name_their_source(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\(from config file .*ister\.yml\)"):
        _load(tmp_path, "wal: {fsync: never}\n")
    with pytest.raises(ConfigError, match=r"\(from the command line\)"):
        _load(flags={"wal.fsync": "never"})


@pytest.mark.parametrize(
    "yaml_text", ["- a\n- b\n", "just a string\n", "42\n"], ids=["list", "string", "number"]
)
def test_top_level_must_be_mapping(tmp_path: Path, yaml_text: str) -> None:
    with pytest.raises(ConfigError, match="mapping"):
        _load(tmp_path, yaml_text)


def test_yaml_syntax_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid YAML"):
        _load(tmp_path, "wal: {fsync: always\n")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "absent.yml", None, {})


def test_section_replaced_by_scalar_rejected(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="wal"):
        _load(tmp_path, "wal: fast\n")


# -- HOST:PORT -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("127.0.0.1:6650", ("127.0.0.1", 6650)),
        ("localhost:0", ("localhost", 0)),
        ("0.0.0.0:65535", ("0.0.0.0", 65535)),
        ("[::1]:9040", ("[::1]", 9040)),
    ],
)
def test_split_host_port_valid(value: str, expected: tuple[str, int]) -> None:
    assert split_host_port(value) == expected


@pytest.mark.parametrize(
    "value", ["6650", "host", "host:", ":6650", "host:65536", "host:-1", "host:port", "host:66 50", ""]
)
def test_split_host_port_invalid(value: str) -> None:
    with pytest.raises(ConfigError, match="HOST:PORT"):
        split_host_port(value)


@pytest.mark.parametrize("key", ["broker_addr", "admin_addr", "prom_exporter"])
def test_bad_address_names_the_key(key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        _load(flags={key: "no-port-here"})


def test_prom_exporter_may_be_disabled() -> None:
    assert _load(flags={"prom_exporter": None}).prom_exporter == "127.0.0.1:9040"  # None = flag unset
    assert _load(env={"ISTER_PROM_EXPORTER": "null"}).prom_exporter is None


def test_split_host_port_superscript_digit_is_config_error() -> None:
    with pytest.raises(ConfigError, match="HOST:PORT"):
        split_host_port("host:²")


# -- values the broker would refuse later are refused up front -------------------------------------------


def test_invalid_bootstrap_namespace_is_config_error() -> None:
    with pytest.raises(ConfigError, match="bootstrap_namespaces"):
        _load(flags={"bootstrap_namespaces": ["has space"]})


def test_invalid_cluster_name_is_config_error() -> None:
    with pytest.raises(ConfigError, match="cluster_name"):
        _load(flags={"cluster_name": "a/b"})


def test_dispatch_values_beyond_failure_policy_range_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="max_redelivery_count"):
        _load(flags={"dispatch.max_redelivery_count": 2**40})


def test_metrics_settings() -> None:
    cfg = _load()
    assert cfg.metrics.per_topic is True and cfg.metrics.max_topics == 500
    env = {"ISTER_METRICS__PER_TOPIC": "false", "ISTER_METRICS__MAX_TOPICS": "20"}
    cfg = _load(env=env)
    assert cfg.metrics.per_topic is False and cfg.metrics.max_topics == 20
    with pytest.raises(ConfigError, match=r"metrics.max_topics must be in 0..100000 \(from environment"):
        _load(env={"ISTER_METRICS__MAX_TOPICS": "-1"})


# -- TLS to etcd -----------------------------------------------------------------------------------------


def test_etcd_tls_settings_are_checked(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    ok = _load(
        flags={"cluster.etcd_endpoints": ["https://e1:2379", "e2:2379"], "cluster.etcd_tls.ca_file": str(ca)}
    )
    assert ok.cluster.etcd_tls.ca_file == str(ca) and ok.cluster.etcd_tls.enabled
    env = _load(env={"ISTER_CLUSTER__ETCD_TLS__CA_FILE": str(ca)})
    assert env.cluster.etcd_tls.ca_file == str(ca)
    cases = [
        (
            {"cluster.etcd_endpoints": ["https://e:2379"]},
            "https:// endpoints but cluster.etcd_tls.ca_file is not set",
        ),
        (
            {"cluster.etcd_endpoints": ["http://e:2379"], "cluster.etcd_tls.ca_file": str(ca)},
            "has http:// (plaintext) endpoints",
        ),
        ({"cluster.etcd_tls.ca_file": str(tmp_path / "missing.pem")}, "cluster.etcd_tls.ca_file: file"),
        ({"cluster.etcd_tls.ca_file": str(ca), "cluster.etcd_tls.cert_file": str(ca)}, "go together"),
        ({"cluster.etcd_tls.cert_file": str(ca), "cluster.etcd_tls.key_file": str(ca)}, "needs ca_file"),
        (
            {"cluster.etcd_endpoints": ["grpc://e:2379"]},
            "use HOST:PORT, http://HOST:PORT or https://HOST:PORT",
        ),
    ]
    for flags, message in cases:
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            _load(flags=flags)


def test_etcd_endpoint_schemes_follow_the_tls_setting() -> None:
    from ister.errors import InvalidArgument
    from ister.metadata.etcd import parse_endpoint

    assert str(parse_endpoint("e:1", tls=True)) == "e:1"
    assert str(parse_endpoint("https://e:1", tls=True)) == "e:1"
    assert str(parse_endpoint("http://e", tls=False)) == "e:2379"
    with pytest.raises(InvalidArgument, match="no TLS settings"):
        parse_endpoint("https://e:1")
    with pytest.raises(InvalidArgument, match="plaintext http://"):
        parse_endpoint("http://e:1", tls=True)
