"""Issue 17 from the command line: `ister admin schemas ...`, `ister admin topics create --schema-subject`,
`ister produce --schema-file/--schema-subject` and `ister consume` printing decoded records."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest

from ister.client import Client
from tests.integration.forkserver import run_ister
from tests.integration.harness import BrokerProcess

pytestmark = pytest.mark.integration

READING = {
    "type": "record",
    "name": "Reading",
    "fields": [{"name": "id", "type": "long"}, {"name": "v", "type": "double"}],
}


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return run_ister(list(args), timeout=timeout)


async def subscribe(url: str, topic: str, subscription: str) -> None:
    async with Client(url) as c:
        consumer = await c.consumer(topic, subscription, type="exclusive", name="consumer_pubsub")
        await consumer.close()


def test_schema_cli_round_trip(shared_broker: BrokerProcess, topic: str, tmp_path: Path) -> None:
    admin = ["--admin-addr", shared_broker.admin_addr]
    subject = "cli-" + topic.rsplit("/", 1)[1]
    v1 = tmp_path / "reading.avsc"
    v1.write_text(json.dumps(READING))
    bad = tmp_path / "bad.avsc"
    bad.write_text(json.dumps({**READING, "fields": [{"name": "id", "type": "string"}]}))
    done = run("admin", "schemas", "register", subject, "-f", str(v1), *admin, "-o", "json")
    assert done.returncode == 0, done.stderr
    registered = json.loads(done.stdout)
    assert (registered["version"], registered["is_new_version"]) == (1, True)
    check = run("admin", "schemas", "check", subject, "-f", str(bad), *admin)
    assert check.returncode == 1 and "incompatible" in check.stdout
    refused = run("admin", "schemas", "register", subject, "-f", str(bad), *admin)
    assert refused.returncode == 1 and "FAILED_PRECONDITION" in refused.stderr
    versions = run("admin", "schemas", "versions", subject, *admin, "-o", "json")
    assert [v["version"] for v in json.loads(versions.stdout)] == [1]
    mode = run("admin", "schemas", "mode", subject, "full_transitive", *admin)
    assert mode.returncode == 0, mode.stderr
    got = run("admin", "schemas", "get", subject, *admin, "-o", "json")
    assert json.loads(got.stdout)["compatibility_mode"] == "full_transitive"
    missing = run("admin", "topics", "create", topic, "--reliable", "--schema-subject", "nope", *admin)
    assert missing.returncode == 1 and "nope" in missing.stderr
    created = run("admin", "topics", "create", topic, "--reliable", "--schema-subject", subject, *admin)
    assert created.returncode == 0, created.stderr
    url = shared_broker.url
    asyncio.run(subscribe(url, topic, "cli"))  # the subscription exists before the message: it gets it
    sent = run(
        "produce",
        "-s",
        url,
        "-t",
        topic,
        "--reliable",
        "--schema-subject",
        subject,
        "-m",
        '{"id": 7, "v": 2.5}',
        "--json",
    )
    assert sent.returncode == 0, sent.stderr
    off_schema = run(
        "produce", "-s", url, "-t", topic, "--reliable", "--schema-subject", subject, "-m", '{"id": "seven"}'
    )
    assert off_schema.returncode == 1 and "Avro" in off_schema.stderr
    plain = run("produce", "-s", url, "-t", topic, "--reliable", "-m", "no schema")
    assert plain.returncode == 1 and "no schema id" in plain.stderr  # enforce
    consumed = run(
        "consume", "-s", url, "-t", topic, "-m", "cli", "--sub-type", "exclusive", "--count", "1", "--json"
    )
    assert consumed.returncode == 0, consumed.stderr
    record = json.loads(consumed.stdout.splitlines()[0])
    assert record["value"] == {"id": 7, "v": 2.5} and record["schema_version"] == 1
    in_use = run("admin", "schemas", "delete", subject, "--version", "1", *admin)
    assert in_use.returncode == 1 and "in use" in in_use.stderr
    listed = run("admin", "schemas", "list", *admin, "-o", "json")
    assert any(s["subject"] == subject for s in json.loads(listed.stdout))
