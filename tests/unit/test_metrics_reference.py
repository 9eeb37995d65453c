"""docs/metrics.md names every series the broker exports, and no series it does not."""

from __future__ import annotations

import re
from pathlib import Path

from tests.unit.exported_metrics import families

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def _documented() -> set[str]:
    text = REFERENCE.read_text(encoding="utf-8")
    names: set[str] = set()
    for span in re.findall(r"`([^`]+)`", text):
        first = re.match(r"((?:danube|ister)_[a-z0-9_]+)", span)
        if first is None:
            continue
        names.add(first.group(1))
    # "`danube_cluster_balance_cv`, `_mean_load`": suffixes written after a full name
    for head, tails in re.findall(r"`((?:danube|ister)_[a-z0-9_]+?)_[a-z]+`((?:, `_[a-z_]+`)+)", text):
        names.update(head + tail for tail in re.findall(r"`(_[a-z_]+)`", tails))
    return names


def test_every_exported_series_is_documented() -> None:
    missing = families() - _documented()
    assert not missing, f"docs/metrics.md lacks {sorted(missing)}"


def test_latency_histograms_and_renamed_gauges_are_described() -> None:
    text = REFERENCE.read_text(encoding="utf-8")
    for name in ("ister_publish_durable_seconds", "ister_wal_fsync_seconds", "ister_broker_cpu_usage_ratio"):
        assert f"`{name}`" in text
    assert "danube_broker_cpu_usage" in text  # the seed's name, and why it changed
