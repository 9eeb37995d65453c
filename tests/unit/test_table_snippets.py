"""`ister table`'s Spark snippet (not runnable here: no Iceberg jar offline): a SQL catalog's JDBC driver is
among the packages, since Iceberg's JdbcCatalog needs it on the classpath; a REST catalog needs none."""

from __future__ import annotations

import importlib

import pytest

importlib.import_module("ister.cli.main")  # first: it imports the command modules in their order
from ister.cli.tables import snippets  # noqa: E402


@pytest.mark.parametrize(
    ("uri", "driver"),
    [
        ("sqlite:////data/tables/catalog.db", "org.xerial:sqlite-jdbc:"),
        ("postgresql://u:p@db/ister", "org.postgresql:postgresql:"),
        ("https://catalog.example/api", None),
    ],
)
def test_the_spark_snippet_brings_the_catalogs_jdbc_driver(uri: str, driver: str | None) -> None:
    spark = snippets(uri, ["default.events"], {"warehouse": "file:///w"})["spark"]
    packages = spark.split('"spark.jars.packages", "', 1)[1].split('"', 1)[0].split(",")
    assert packages[0].startswith("org.apache.iceberg:iceberg-spark-runtime-")
    assert packages[1:] == ([] if driver is None else [p for p in packages[1:] if p.startswith(driver)])
    assert len(packages) == (1 if driver is None else 2)
    assert "u:p" not in spark  # no credentials printed


def test_a_postgresql_snippet_takes_user_and_password_from_the_environment() -> None:
    code = snippets("postgresql+psycopg2://ister@db:5432/lake", ["default.events"], {"warehouse": "s3://b/t"})
    assert (
        "PGPASSWORD" in code["pyiceberg"]
        and '"uri": "postgresql+psycopg2://ister@db:5432/lake"' in code["pyiceberg"]
    )
    assert '"jdbc:postgresql://db:5432/lake"' in code["spark"]
    assert '.jdbc.user", "ister"' in code["spark"] and code["spark"].startswith("import os\n")
    compile(code["spark"], "spark", "exec")
