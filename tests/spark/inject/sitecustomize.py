"""Fault injection into the sink's own Python workers, for tests/spark/sink_driver.py (the driver puts this
directory on PYTHONPATH; Spark's workers inherit it). A Python UDF upstream of the sink cannot place a
failure after given rows are stored: its worker holds its results in a buffer until its batch ends.

ISTER_TEST_SINK_FAIL=VALUE: on a task's first attempt, the row whose value is VALUE fails the task once
every batch sent before it is stored. ISTER_TEST_SINK_HOLD=VALUE: at that row, once every batch before it
is stored, the task creates the file ISTER_TEST_SINK_HELD and waits until its worker's parent is gone (the
test kills the driver)."""

from __future__ import annotations

import os
import time
from typing import Any

_FAIL = os.environ.get("ISTER_TEST_SINK_FAIL", "").encode()
_HOLD = os.environ.get("ISTER_TEST_SINK_HOLD", "").encode()

if _FAIL or _HOLD:
    from ister.spark import once

    _add = once.ExactSends.add

    def _drain(sends: Any) -> None:
        for future in list(sends._in_flight):
            future.result()

    def add(self: Any, destination: str, message: Any) -> None:
        value = bytes(message[0])
        if _FAIL and value == _FAIL:
            from pyspark import TaskContext

            ctx = TaskContext.get()
            if ctx is not None and ctx.attemptNumber() == 0:
                _drain(self)
                raise RuntimeError(f"injected failure at {value!r} (first attempt)")
        if _HOLD and value.startswith(_HOLD):
            _drain(self)
            with open(os.environ["ISTER_TEST_SINK_HELD"], "w"):
                pass
            parent = os.getppid()
            deadline = time.monotonic() + 300
            while os.getppid() == parent and time.monotonic() < deadline:
                time.sleep(0.2)
        _add(self, destination, message)

    once.ExactSends.add = add  # type: ignore[method-assign]
