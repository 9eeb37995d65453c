"""Opt-in pytest plugin: CPU seconds and wall time per test module (issue 40 item 6).

    PYTHONPATH=. pytest -p tests.cpu_per_module [-n N] tests/...

Each test's setup, call and teardown are measured with `getrusage`: the process's own CPU (RUSAGE_SELF)
plus that of its children (RUSAGE_CHILDREN), which the kernel adds only once a child is waited for, so a
broker's CPU lands on the module whose test (or module fixture's teardown) stopped it; brokers forked by
tests/integration/forkserver.py are reaped by it, which reports their CPU. Session fixtures (etcd,
SeaweedFS) are torn down in the last test's teardown: that share, and collection, have rows of their
own. Under pytest-xdist each worker sends its figures to the controller (`workeroutput`), which merges
them. The table is printed at the end (`--cpu-per-test N` adds the N tests of most CPU) and written as
JSON, modules and tests, to `--cpu-per-module-out` (default cpu-per-module.json).
"""

from __future__ import annotations

import json
import resource
import sys
import time
from collections.abc import Generator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest

COLLECTION = "<collection and start>"
SESSION_END = "<session end>"
_KEY = "cpu_per_module"


@dataclass
class Row:
    tests: int = 0
    cpu_self: float = 0.0
    cpu_children: float = 0.0
    wall: float = 0.0

    @property
    def cpu(self) -> float:
        return self.cpu_self + self.cpu_children

    def add(self, other: Row) -> None:
        self.tests += other.tests
        self.cpu_self += other.cpu_self
        self.cpu_children += other.cpu_children
        self.wall += other.wall


def _cpu(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def _children_cpu() -> float:
    """Reaped children's CPU, with the brokers reaped by the broker fork server (not our children)."""
    forked = sys.modules.get("tests.integration.forkserver")
    return _cpu(resource.RUSAGE_CHILDREN) + (forked.reaped_cpu() if forked is not None else 0.0)


class _Sample:
    def __init__(self) -> None:
        self.self_ = _cpu(resource.RUSAGE_SELF)
        self.children = _children_cpu()
        self.wall = time.perf_counter()

    def since(self, start: _Sample, tests: int) -> Row:
        return Row(tests, self.self_ - start.self_, self.children - start.children, self.wall - start.wall)


class CpuPerModule:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.rows: dict[str, Row] = {}
        self.tests: dict[str, Row] = {}  # per test too, for `--cpu-per-test N`
        self.last = _Sample()  # the process's start to here is not seen; collection is counted from here
        self.first_test = True
        self.mark: _Sample | None = None  # in the last test's teardown: when the last fixture finished
        self.session_teardown = Row()  # that teardown's share spent on session fixtures (etcd, SeaweedFS)

    def _charge(self, key: str, row: Row) -> None:
        self.rows.setdefault(key, Row()).add(row)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, None, None]:
        start = _Sample()
        if self.first_test:
            self._charge(COLLECTION, start.since(self.last, 0))
            self.first_test = False
        yield
        end = _Sample()
        row = end.since(start, 1)
        shared, self.session_teardown = self.session_teardown, Row()
        row.add(Row(0, -shared.cpu_self, -shared.cpu_children, -shared.wall))
        self._charge(SESSION_END, shared)
        self._charge(item.nodeid.split("::", 1)[0], row)
        self.tests[item.nodeid] = row
        self.last = end

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(
        self, item: pytest.Item, nextitem: pytest.Item | None
    ) -> Generator[None, None, None]:
        self.mark = _Sample() if nextitem is None else None  # the last test tears the session down
        yield
        self.mark = None

    def pytest_fixture_post_finalizer(self, fixturedef: Any, request: Any) -> None:
        if self.mark is None:
            return
        now = _Sample()
        if fixturedef.scope == "session":
            self.session_teardown.add(now.since(self.mark, 0))
        self.mark = now

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        # trylast: after the session fixtures' teardown (pytest's own sessionfinish runs it) reaped etcd.
        if not self.first_test:  # not xdist's controller: its reaped children are the workers, counted
            self._charge(SESSION_END, _Sample().since(self.last, 0))
        workeroutput = getattr(self.config, "workeroutput", None)
        if workeroutput is not None:  # an xdist worker: the controller merges
            workeroutput[_KEY] = {k: asdict(v) for k, v in self.rows.items()}
            workeroutput[_KEY + "_tests"] = {k: asdict(v) for k, v in self.tests.items()}

    @pytest.hookimpl(optionalhook=True)  # xdist's hook: absent without it
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        output = getattr(node, "workeroutput", {})
        for key, row in output.get(_KEY, {}).items():
            self._charge(key, Row(**row))
        self.tests.update((k, Row(**v)) for k, v in output.get(_KEY + "_tests", {}).items())

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if hasattr(self.config, "workeroutput"):
            return
        rows = sorted(self.rows.items(), key=lambda kv: kv[1].cpu, reverse=True)
        total = Row()
        for _, row in rows:
            total.add(row)
        tr = terminalreporter
        tr.write_sep("-", "CPU per test module (s; children counted when reaped)")
        tr.write_line(f"{'cpu':>8} {'self':>8} {'children':>8} {'wall':>8} {'tests':>5}  module")
        for key, row in [*rows, ("TOTAL", total)]:
            tr.write_line(
                f"{row.cpu:8.1f} {row.cpu_self:8.1f} {row.cpu_children:8.1f} {row.wall:8.1f} "
                f"{row.tests:5d}  {key}"
            )
        top = self.config.getoption("cpu_per_test")
        if top:
            tr.write_sep("-", f"the {top} tests of most CPU (s)")
            for key, row in sorted(self.tests.items(), key=lambda kv: kv[1].cpu, reverse=True)[:top]:
                tr.write_line(
                    f"{row.cpu:8.1f} {row.cpu_self:8.1f} {row.cpu_children:8.1f} {row.wall:8.1f}  {key}"
                )
        out = Path(self.config.getoption("cpu_per_module_out"))
        out.write_text(
            json.dumps(
                {
                    "modules": {k: {**asdict(v), "cpu": v.cpu} for k, v in rows},
                    "tests": {k: {**asdict(v), "cpu": v.cpu} for k, v in self.tests.items()},
                },
                indent=1,
                sort_keys=True,
            )
            + "\n"
        )
        tr.write_line(f"written to {out}")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-per-module-out",
        default="cpu-per-module.json",
        help="where tests.cpu_per_module writes its table as JSON",
    )
    parser.addoption(
        "--cpu-per-test", type=int, default=0, metavar="N", help="also list the N tests of most CPU"
    )


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(CpuPerModule(config), "cpu_per_module_instance")
