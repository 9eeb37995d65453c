"""`ister produce` / `ister consume` as a user runs them, against a real broker."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.integration.harness import BrokerProcess

pytestmark = pytest.mark.integration
ISTER = [sys.executable, "-m", "ister.cli"]


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ISTER, *args], capture_output=True, text=True, timeout=timeout, check=False)


def test_produce_then_consume_json(shared_broker: BrokerProcess, topic: str) -> None:
    url = shared_broker.url
    # A subscription that exists before the messages: consume once with nothing to read would block, so
    # create it by producing one message first and consuming it.
    first = run("produce", "-s", url, "-t", topic, "-m", "first", "--reliable", "--json")
    assert first.returncode == 0, first.stderr
    consumer = subprocess.Popen(
        [
            *ISTER,
            "consume",
            "-s",
            url,
            "-t",
            topic,
            "-m",
            "cli-sub",
            "--sub-type",
            "exclusive",
            "--count",
            "5",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        produced = None
        while time.monotonic() < deadline:
            # Produce until the consumer (subscribed at the latest offset) has seen five messages.
            produced = run(
                "produce",
                "-s",
                url,
                "-t",
                topic,
                "-m",
                "héllo",
                "-a",
                "k:v,x:y",
                "-c",
                "5",
                "--reliable",
                "--json",
            )
            assert produced.returncode == 0, produced.stderr
            try:
                out, err = consumer.communicate(timeout=3)
                break
            except subprocess.TimeoutExpired:
                continue
        else:
            raise AssertionError("consumer did not finish")
    finally:
        consumer.kill()
    assert consumer.returncode == 0, err
    assert produced is not None
    sent = [json.loads(line) for line in produced.stdout.splitlines()]
    assert len(sent) == 5 and all(s["topic"] == topic for s in sent)
    got = [json.loads(line) for line in out.splitlines()]
    assert len(got) == 5
    for msg in got:
        assert msg["topic"] == topic
        assert msg["payload"] == "héllo"
        assert msg["attributes"] == {"k": "v", "x": "y"}
        assert isinstance(msg["publish_time"], int) and msg["publish_time"] > 0
    offsets = [m["offset"] for m in got]
    assert offsets == sorted(offsets) and len(set(offsets)) == 5


def test_cli_errors_are_clear(shared_broker: BrokerProcess) -> None:
    url = shared_broker.url
    bad = run("produce", "-s", url, "-t", "no-slash", "-m", "x")
    assert bad.returncode == 1 and "invalid topic name" in bad.stderr
    missing = run(
        "consume", "-s", url, "-t", "/default/does_not_exist_cli", "-m", "s", "--count", "1", "--timeout", "0"
    )
    assert missing.returncode == 1 and "does not exist" in missing.stderr
    assert "waiting" not in missing.stderr  # --timeout 0: no wait at all
    nopayload = run("produce", "-s", url, "-t", "/default/x")
    assert nopayload.returncode == 1 and "--message" in nopayload.stderr
    badattr = run("produce", "-s", url, "-t", "/default/x", "-m", "x", "-a", "novalue")
    assert badattr.returncode == 1 and "KEY:VALUE" in badattr.stderr
    badtype = run("consume", "-s", url, "-t", "/default/x", "-m", "s", "--sub-type", "weird")
    assert badtype.returncode == 1 and "--sub-type" in badtype.stderr


def test_consume_waits_for_a_topic_created_later(shared_broker: BrokerProcess, topic: str) -> None:
    """A consumer started before its producer waits for the topic, says so, then consumes."""
    url = shared_broker.url
    consumer = subprocess.Popen(
        [*ISTER, "consume", "-s", url, "-t", topic, "-m", "early", "--count", "1", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert consumer.stderr is not None
        first = consumer.stderr.readline()
        assert f"topic {topic} does not exist yet: waiting" in first, first
        created = run(
            "admin", "topics", "create", topic, "--reliable", "--admin-addr", shared_broker.admin_addr
        )
        assert created.returncode == 0, created.stderr
        second = consumer.stderr.readline()
        assert f"topic {topic} exists now: consuming" in second, second
        produced = run("produce", "-s", url, "-t", topic, "-m", "late", "--reliable")
        assert produced.returncode == 0, produced.stderr
        out, err = consumer.communicate(timeout=30)
    finally:
        consumer.kill()
    assert consumer.returncode == 0, err
    assert [json.loads(line)["payload"] for line in out.splitlines()] == ["late"]


def test_consume_wait_for_a_topic_ends_at_timeout(shared_broker: BrokerProcess, topic: str) -> None:
    done = run("consume", "-s", shared_broker.url, "-t", topic, "-m", "s", "--timeout", "0.3")
    assert done.returncode == 1
    assert "waiting for up to 0.3 s" in done.stderr
    assert f"error: topic {topic} does not exist" in done.stderr and "waited 0.3 s" in done.stderr
