"""Table policies (docs/tables.md, "Policy"): parsing, validation, and which level wins."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from ister.config import BrokerConfig
from ister.config_checks import check
from ister.errors import ConfigError, InvalidArgument
from ister.tables.catalog import CatalogSpec, spec_for
from ister.tables.policy import TableSetting, checked, in_effect, parse_setting


def test_parse_and_refuse_bad_input() -> None:
    assert parse_setting("iceberg", "hour", "30s") == TableSetting("iceberg", "hour", 30_000)
    for args, message in [
        (("parquet", None, None), "unknown table format"),
        ((None, "week", None), "unknown table partitioning"),
        ((None, None, "10ms"), "out of range"),
        ((None, None, "2d"), "out of range"),
        ((None, None, "soon"), "invalid table commit interval"),
    ]:
        with pytest.raises(InvalidArgument, match=message):
            parse_setting(*args)
    # A negative, zero or unreadable interval is refused with the range actually accepted: the generic
    # duration message offered "or 0" (unlimited), which an interval cannot be.
    for text in ("-5s", "0", "soon"):
        with pytest.raises(InvalidArgument) as refused:
            parse_setting(None, None, text)
        assert "between 1s and 1d" in str(refused.value), str(refused.value)
        assert "or 0" not in str(refused.value) and "unlimited" not in str(refused.value)
    assert checked(None, None, None).empty
    with pytest.raises(InvalidArgument, match=r"interval 0s is out of range: between 1s and 1d"):
        checked(None, None, 0)  # the RPC's interval_ms = 0


def test_topic_overrides_namespace_field_by_field() -> None:
    ns = TableSetting.of_namespace({"table_format": "iceberg", "table_interval_ms": 5_000, "other": 1})
    p = in_effect(TableSetting(partition="hour"), ns)
    assert (p.format, p.format_source) == ("iceberg", "namespace")
    assert (p.partition, p.partition_source) == ("hour", "topic")
    assert (p.interval_ms, p.interval_source) == (5_000, "namespace")
    off = in_effect(TableSetting(format="none"), ns)
    assert not off.on and off.format_source == "topic"
    default = in_effect(None, TableSetting())
    assert (default.format, default.partition, default.interval_ms) == ("none", "day", 10_000)


def test_stored_values_are_read_leniently_and_merged() -> None:
    bad = TableSetting.from_json({"format": "orc", "partition": "hour", "interval_ms": 10})
    assert bad == TableSetting(None, "hour", None)
    assert TableSetting.from_json("nonsense") == TableSetting()
    merged = TableSetting("iceberg", "day", 1_000).merged(TableSetting(partition="hour"))
    assert merged.to_json() == {"format": "iceberg", "partition": "hour", "interval_ms": 1_000}


def test_catalog_defaults_and_config_checks(tmp_path: Path) -> None:
    spec = spec_for(BrokerConfig(), tmp_path)
    assert spec.uri == f"sqlite:///{tmp_path.resolve()}/tables/catalog.db"
    assert spec.warehouse == (tmp_path / "objects").resolve().as_uri() + "/tables"
    s3 = msgspec.convert(
        {
            "storage": {
                "durable": {
                    "url": "s3://b/p",
                    "options": {"endpoint": "http://h:1", "aws_secret_access_key": "s", "region": "r"},
                }
            }
        },
        BrokerConfig,
    )
    spec = spec_for(s3, tmp_path)
    assert spec.warehouse == "s3://b/p/tables"
    assert spec.properties == {"s3.endpoint": "http://h:1", "s3.secret-access-key": "s", "s3.region": "r"}
    assert "s3.secret-access-key" not in spec.public_properties()
    with pytest.raises(ConfigError, match=r"tables\.catalog_uri"):
        check(msgspec.convert({"tables": {"catalog_uri": "mysql://x"}}, BrokerConfig))


def test_postgresql_catalog_uri_names_the_shipped_driver_and_hides_the_password(tmp_path: Path) -> None:
    """SQLAlchemy 2.1 opens a bare postgresql:// with psycopg 3, not shipped: the broker names psycopg2
    (pyiceberg's sql-postgres extra), and `ister table` shows the URI without its password."""

    def spec(uri: str) -> CatalogSpec:
        return spec_for(msgspec.convert({"tables": {"catalog_uri": uri}}, BrokerConfig), tmp_path)

    bare = spec("postgresql://ister:s3cret@db:5432/lake")
    assert bare.uri == "postgresql+psycopg2://ister:s3cret@db:5432/lake"
    assert bare.public_uri() == "postgresql+psycopg2://ister@db:5432/lake"
    assert bare.public_properties() == {"pool_pre_ping": "true"}  # readers' pools outlive a restart too
    assert spec("postgresql+psycopg2://ister@db/lake").public_uri() == "postgresql+psycopg2://ister@db/lake"
    assert spec("postgresql+psycopg2://db/lake").public_uri() == "postgresql+psycopg2://db/lake"
    assert spec("sqlite:////x/c.db").public_uri() == "sqlite:////x/c.db"
    for wrong in ("postgresql+psycopg://db/lake", "postgresql+asyncpg://db/lake"):
        with pytest.raises(ConfigError, match="psycopg2"):
            check(msgspec.convert({"tables": {"catalog_uri": wrong}}, BrokerConfig))
        with pytest.raises(InvalidArgument, match="psycopg2"):
            spec(wrong)


def test_packed_records_round_trip() -> None:
    from ister.tables.packing import pack, unpack

    records = [(5, b"ab"), (7, b""), (9, b"xyz"), (1 << 40, bytes(range(256)))]
    assert unpack(*pack(records)) == records
    assert unpack(*pack([])) == []
