"""Helpers for the client's bidirectional streams."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, NoReturn

import grpc

from ister.client.errors import ConnectionLost, from_status


async def raise_call_status(call: Any, what: str) -> NoReturn:
    """Raise the finished call's status as an IsterError (ConnectionLost when it ended with OK or none)."""
    try:
        code = await asyncio.wait_for(call.code(), 5.0)
        details = await call.details()
        trailers = await call.trailing_metadata()
    except Exception:
        raise ConnectionLost(what) from None
    if code == grpc.StatusCode.OK:
        raise ConnectionLost(what)
    raise from_status(code, details, trailers)


async def run_until_first_error(*coros: Coroutine[Any, Any, None], name: str) -> None:
    """Run the coroutines as tasks until one ends; cancel the others; re-raise the first failure.

    Returns normally only when a task returned normally (e.g. a reader that saw a clean end of stream)."""
    tasks = [asyncio.create_task(c, name=f"{name}#{i}") for i, c in enumerate(coros)]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
    for t in tasks:
        if t in done and not t.cancelled() and t.exception() is not None:
            exc = t.exception()
            assert exc is not None
            raise exc
