"""The names of every series an Ister broker exports, and the metric names a PromQL expression reads.

From the registry the broker process fills (every module of src/ister that defines a metric), plus the
families exported by Ister's own collectors: the bounded per-topic families
(`broker/metrics.py`) and the latency histograms (`ister/histogram.py`). Shared by the dashboard, alert
and metrics-reference tests.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from prometheus_client import REGISTRY

HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
_METRIC = re.compile(r"\b(?:danube|ister)_[a-z0-9_]+\b")


SRC = Path(__file__).resolve().parents[2] / "src"
_DEFINES = re.compile(
    r"^from prometheus_client import .*\b(Counter|Gauge|Histogram|Info)\b"
    r"|^from ister.histogram import histogram",
    re.M,
)


def _load_metric_modules() -> None:
    """Import every module of src/ister that defines a metric (found by its imports). Not `ister.app`: that
    imports Ister's generated Danube protos, which clash with the `danube` client's in one process."""
    for path in sorted((SRC / "ister").rglob("*.py")):
        if _DEFINES.search(path.read_text(encoding="utf-8")):
            module = ".".join(path.relative_to(SRC).with_suffix("").parts)
            importlib.import_module(module)


def exported() -> set[str]:
    """Sample names (`x_total`, `x_bucket`, ...) of every series the broker exports."""
    _load_metric_modules()
    from ister import histogram
    from ister.broker import metrics

    names = {n for n in REGISTRY._names_to_collectors if not n.endswith("_created")}
    for family in metrics.TOPIC_FAMILIES:
        suffix = "_total" if family.kind == "counter" else ""
        names.add(family.name + suffix)
        if family.total_name is not None:
            names.add(family.total_name + suffix)
    names.add("ister_metrics_topics")
    for name in histogram._collector.histograms:
        names.update(name + s for s in HISTOGRAM_SUFFIXES)
    return {n for n in names if n.startswith(("danube_", "ister_"))}


def families() -> set[str]:
    """Family names as a reference lists them: counters with `_total`, histograms without suffixes."""
    names = exported()
    hist = {n.removesuffix("_bucket") for n in names if n.endswith("_bucket")}
    out = set()
    for n in names:
        base = next((n.removesuffix(s) for s in HISTOGRAM_SUFFIXES if n.removesuffix(s) in hist), None)
        if base is not None:
            out.add(base)
        elif n + "_total" in names or n == "ister_build":
            continue  # prometheus_client registers a counter under both names; Info `x` exports x_info
        else:
            out.add(n)
    return out


def metrics_in(expr: str) -> set[str]:
    """The danube_* and ister_* metric names a PromQL expression reads."""
    return set(_METRIC.findall(expr))
