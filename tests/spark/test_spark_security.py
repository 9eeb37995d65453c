"""The Spark source and sink against a broker with TLS and JWT authentication, credentials given only as
the options `ister.auth.token` and `ister.tls.ca`; the token shows in no plan, repr or log."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ister.spark.options import AUTH_TOKEN, TLS_CA, SinkOptions, SourceOptions
from ister.spark.source import IsterBatchReader
from tests.integration.harness import BrokerProcess
from tests.integration.security_support import Pki, make_pki, secret_file, token

pytestmark = pytest.mark.timeout(300)
TOPIC = "/default/spark_secured"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[BrokerProcess]:
    assert "ISTER_TOKEN" not in os.environ and "ISTER_TLS_CA" not in os.environ  # options alone count
    base = tmp_path_factory.mktemp("spark-secured")
    b = BrokerProcess(
        base / "data",
        *("--tls-cert", str(pki.cert_file), "--tls-key", str(pki.key_file)),
        *("--auth-jwt-secret-file", str(secret_file(base)), "--superuser", "spark-job"),
    )
    b.start()
    yield b
    b.stop()


def url(b: BrokerProcess) -> str:
    return f"https://127.0.0.1:{b.port}"


def test_write_then_read_with_token_and_ca_options(spark: Any, secured: BrokerProcess, pki: Pki) -> None:
    jwt = token("spark-job")
    creds = {AUTH_TOKEN: jwt, TLS_CA: str(pki.ca_file)}
    df = spark.createDataFrame([(f"v{i}".encode(), f"k{i}") for i in range(50)], "value binary, key string")
    df.write.format("ister").option("ister.service.url", url(secured)).option("topic", TOPIC).options(
        **creds
    ).mode("append").save()

    reader = spark.read.format("ister").option("ister.service.url", url(secured)).option("topic", TOPIC)
    loaded = reader.options(**creds).load()
    rows = loaded.collect()
    assert sorted(r.value for r in rows) == sorted(f"v{i}".encode() for i in range(50))

    # Nowhere to be seen: the query plan, the parsed options, the input partitions, the broker log.
    plan = loaded._jdf.queryExecution().toString()
    assert jwt not in plan
    opts = {"ister.service.url": url(secured), "topic": TOPIC, **creds}
    source = SourceOptions.parse(opts, streaming=False)
    assert source.auth.token == jwt and source.auth.tls_ca == str(pki.ca_file)
    assert jwt not in repr(source) and jwt not in repr(SinkOptions.parse(opts))
    reader_ = IsterBatchReader(source)
    try:
        parts = reader_.partitions()
        assert parts and all(jwt not in repr(p) for p in parts)
    finally:
        reader_.planner.close()
    assert jwt not in secured.log()


def test_explain_does_not_show_the_token(
    spark: Any, secured: BrokerProcess, pki: Pki, capsys: pytest.CaptureFixture[str]
) -> None:
    jwt = token("spark-job")
    reader = spark.read.format("ister").option("ister.service.url", url(secured)).option("topic", TOPIC)
    reader.option(AUTH_TOKEN, jwt).option(TLS_CA, str(pki.ca_file)).load().explain(mode="extended")
    out = capsys.readouterr().out
    assert "Relation" in out or "Scan" in out  # an explain was printed
    assert jwt not in out


@pytest.mark.parametrize("case", ["no token", "forged token"])
def test_without_a_valid_token_the_query_fails_clearly(
    spark: Any, secured: BrokerProcess, pki: Pki, tmp_path: Path, case: str
) -> None:
    forged = token("spark-job")[:-4] + "AAAA"
    reader = spark.read.format("ister").option("ister.service.url", url(secured)).option("topic", TOPIC)
    reader = reader.option(TLS_CA, str(pki.ca_file))
    if case == "forged token":
        reader = reader.option(AUTH_TOKEN, forged)
    with pytest.raises(Exception) as info:
        reader.load().collect()
    message = str(info.value)
    assert "authentication required" in message or "invalid token" in message, message[-2000:]
    assert forged not in message
