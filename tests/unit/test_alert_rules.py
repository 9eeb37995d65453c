"""deploy/prometheus/alerts.yml: valid rules on series the broker exports, each tested by promtool.

`promtool test rules` runs deploy/prometheus/alerts_test.yml, which feeds every rule series under which it
must fire and healthy ones under which it must not (promtool comes with the Debian package `prometheus`;
`make test` installs it).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.exported_metrics import exported, metrics_in

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
RULES = DEPLOY / "alerts.yml"
RULE_TESTS = DEPLOY / "alerts_test.yml"
# What an on-call needs paged or told about (issue 38 item 3).
EXPECTED = {
    "IsterBrokerDown",
    "IsterTopicsUnderMinIsr",
    "IsterTopicsWithoutLiveInSyncReplica",
    "IsterTopicsUnderReplicated",
    "IsterSubscriptionLagGrowing",
    "IsterExportBacklogOld",
    "IsterDataDiskNearlyFull",
    "IsterDataDiskRefusingPublishes",
    "IsterFailedMoves",
    "IsterRetentionFailing",
    "IsterObjectStoreErrors",
    "IsterPublishLatencyHigh",
    "IsterMessagesDeadLettered",
}


def _rules() -> list[dict[str, Any]]:
    data = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return [rule for group in data["groups"] for rule in group["rules"]]


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool is not installed (Debian package prometheus; `make promtool`)")
    return found


def test_the_expected_alerts_are_there_with_severity_and_text() -> None:
    rules = _rules()
    assert {r["alert"] for r in rules} == EXPECTED
    for rule in rules:
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
        assert rule["annotations"]["summary"].strip(), rule["alert"]
        assert rule["annotations"]["description"].strip(), rule["alert"]


def test_every_series_a_rule_reads_is_exported_by_the_broker() -> None:
    names = exported()
    for rule in _rules():
        missing = metrics_in(rule["expr"]) - names
        assert not missing, f"{rule['alert']}: {sorted(missing)} not exported by the broker"


def test_every_rule_has_a_test_in_which_it_fires() -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))["tests"]
    fired = {case["alertname"] for t in tests for case in t.get("alert_rule_test", []) if case["exp_alerts"]}
    quiet = {
        case["alertname"] for t in tests for case in t.get("alert_rule_test", []) if not case["exp_alerts"]
    }
    assert fired == EXPECTED
    assert quiet == EXPECTED


def test_promtool_checks_the_rules() -> None:
    done = subprocess.run(
        [_promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_rule_tests_pass() -> None:
    done = subprocess.run(
        [_promtool(), "test", "rules", str(RULE_TESTS)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
