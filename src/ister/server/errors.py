"""Turn IsterErrors into gRPC statuses at the servicer boundary; nothing else escapes as a crash.

A request body that is not a valid message (`Undecodable`, see `ister.server.handlers`) is INVALID_ARGUMENT
before the servicer runs. Every status message is cut to MAX_STATUS_MESSAGE_BYTES: it travels in a header,
and one beyond the client's metadata limit would reach it as RESOURCE_EXHAUSTED instead.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from ister.errors import AskAnother, InvalidArgument, IsterError
from ister.limits import MAX_STATUS_MESSAGE_BYTES
from ister.server.handlers import Undecodable
from ister.wire.status import status_for

log = logging.getLogger(__name__)

T = TypeVar("T")


def status_message(text: str) -> str:
    """`text` cut to MAX_STATUS_MESSAGE_BYTES of UTF-8 (at a character boundary)."""
    data = text.encode()
    if len(data) <= MAX_STATUS_MESSAGE_BYTES:
        return text
    return data[: MAX_STATUS_MESSAGE_BYTES - 3].decode(errors="ignore") + "..."


# Sent with a status whose code is normally retried (RESOURCE_EXHAUSTED, UNAVAILABLE) when this error
# is not: the Ister client then reports it at once (other clients see only the code).
NOT_RETRIABLE = (("ister-retriable", "false"),)
# Sent with AskAnother's UNAVAILABLE: this broker's view may be stale, the Ister client asks another seed.
ASK_ANOTHER = (("ister-ask-another", "true"),)


async def _abort(context: grpc.aio.ServicerContext, exc: BaseException) -> None:
    if isinstance(exc, IsterError):
        code = status_for(exc)
        if not exc.retriable and code in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE):
            await context.abort(code, status_message(str(exc)), trailing_metadata=NOT_RETRIABLE)
        if isinstance(exc, AskAnother):
            await context.abort(code, status_message(str(exc)), trailing_metadata=ASK_ANOTHER)
        await context.abort(code, status_message(str(exc)))
    log.exception("internal error in RPC", exc_info=exc)
    await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}")


def _check(request: Any) -> None:
    if isinstance(request, Undecodable):
        raise InvalidArgument(request.message)


async def _checked(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    async for request in requests:
        _check(request)
        yield request


def unary(fn: Callable[[Any, Any, Any], Awaitable[T]]) -> Callable[[Any, Any, Any], Awaitable[T]]:
    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: Any) -> T:
        try:
            _check(request)
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
    """A unary-request, streaming-response method."""

    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: Any) -> AsyncIterator[T]:
        try:
            _check(request)
            async for item in fn(self, request, context):
                yield item
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _abort(context, exc)

    return wrapper


def bidi_stream(
    fn: Callable[[Any, Any, Any], AsyncIterator[T]],
) -> Callable[[Any, Any, Any], AsyncIterator[T]]:
    """A streaming-request, streaming-response method: an undecodable request frame is INVALID_ARGUMENT
    where the servicer reads it."""

    @functools.wraps(fn)
    async def wrapper(self: Any, requests: Any, context: Any) -> AsyncIterator[T]:
        try:
            async for item in fn(self, _checked(requests), context):
                yield item
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _abort(context, exc)

    return wrapper
