"""Turn IsterErrors into gRPC statuses at the servicer boundary; nothing else escapes as a crash."""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from ister.errors import IsterError
from ister.wire.status import status_for

log = logging.getLogger(__name__)

T = TypeVar("T")


async def _abort(context: grpc.aio.ServicerContext, exc: BaseException) -> None:
    if isinstance(exc, IsterError):
        await context.abort(status_for(exc), str(exc))
    log.exception("internal error in RPC", exc_info=exc)
    await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}")


def unary(fn: Callable[[Any, Any, Any], Awaitable[T]]) -> Callable[[Any, Any, Any], Awaitable[T]]:
    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: Any) -> T:
        try:
            return await fn(self, request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _abort(context, exc)
            raise  # unreachable: abort raises

    return wrapper


def server_stream(
    fn: Callable[[Any, Any, Any], AsyncIterator[T]],
) -> Callable[[Any, Any, Any], AsyncIterator[T]]:
    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: Any) -> AsyncIterator[T]:
        try:
            async for item in fn(self, request, context):
                yield item
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _abort(context, exc)

    return wrapper
