"""gRPC status → `ister.errors` classes, on the client side.

The broker maps its errors to status codes with `ister.wire.status`; this is the inverse, kept here so the
client never imports the Danube protobuf modules (they clash with the official danube-client's
registrations in one process). The error carries the server's message unchanged.

Retriability is decided by the status code, not only by the class: transport failures (the connection
dropped, the stream was reset, the call timed out) are retried by the client's reconnect loops, whatever
class they map to.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import grpc

from ister import errors

if TYPE_CHECKING:
    from ister.client._conn import RetryBudget

_CLASSES: dict[grpc.StatusCode, type[errors.IsterError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: errors.InvalidArgument,
    grpc.StatusCode.NOT_FOUND: errors.NotFound,
    grpc.StatusCode.ALREADY_EXISTS: errors.AlreadyExists,
    grpc.StatusCode.FAILED_PRECONDITION: errors.FailedPrecondition,
    grpc.StatusCode.PERMISSION_DENIED: errors.PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: errors.Unauthenticated,
    grpc.StatusCode.UNAVAILABLE: errors.Unavailable,
    grpc.StatusCode.RESOURCE_EXHAUSTED: errors.ResourceExhausted,
    grpc.StatusCode.DEADLINE_EXCEEDED: errors.Timeout,
    grpc.StatusCode.OUT_OF_RANGE: errors.OffsetOutOfRange,
    grpc.StatusCode.INTERNAL: errors.StorageError,
    grpc.StatusCode.UNIMPLEMENTED: errors.FailedPrecondition,
    # A stream reset or a call cancelled by the other side: the connection is gone, not the request wrong.
    grpc.StatusCode.CANCELLED: errors.Unavailable,
    grpc.StatusCode.UNKNOWN: errors.Unavailable,
    grpc.StatusCode.ABORTED: errors.Unavailable,
    grpc.StatusCode.DATA_LOSS: errors.DataLoss,
}

# Codes after which the same request may succeed on a new stream (possibly after a new lookup).
RETRIABLE_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.ABORTED,
    }
)


class ConnectionLost(errors.Unavailable):
    """The stream ended without a status (the broker went away): retried like UNAVAILABLE."""


# grpcio's asyncio client replaces the server's status with this one when a write fails because the server
# already ended the stream (grpc/grpc#36066, still in grpcio 1.85): the real status is lost. The client
# treats it as a dropped connection; after a reconnect it sends the first unacknowledged batch alone, so
# that a batch the broker rejects is rejected again with its real status and no write racing it.
MASKED_STATUS_DETAILS = "Internal error from Core"


def from_status(code: grpc.StatusCode, details: str | None, trailers: Any = None) -> errors.IsterError:
    """The error for a gRPC status; `retriable` is set per instance from the code, unless the broker said
    in the trailers that this one is not (`ister-retriable: false`, a backlog quota)."""
    if code is grpc.StatusCode.INTERNAL and details == MASKED_STATUS_DETAILS:
        return ConnectionLost(f"the stream ended with a status grpcio did not report ({details})")
    cls = _CLASSES.get(code, errors.IsterError)
    if code is grpc.StatusCode.UNAVAILABLE and _trailer(trailers, "ister-ask-another") == "true":
        cls = errors.AskAnother
    message = details or code.name
    if code is grpc.StatusCode.UNIMPLEMENTED:
        message = f"the broker does not implement the Ister batch API (ister.v1): {message}"
    if cls is errors.FailedPrecondition and details:  # the idempotence refusals (core/dedup.py)
        if details.startswith("out of order sequence"):
            cls = errors.OutOfOrderSequence
        elif details.startswith("duplicate sequence"):
            cls = errors.DuplicateSequence
    err = cls(message)
    err.retriable = code in RETRIABLE_CODES and not _says_not_retriable(trailers)
    return err


def _says_not_retriable(trailers: Any) -> bool:
    return _trailer(trailers, "ister-retriable") == "false"


def _trailer(trailers: Any, key: str) -> str | None:
    try:
        return next((v for k, v in trailers or () if k == key), None)
    except (TypeError, ValueError):
        return None


def to_ister_error(exc: BaseException) -> errors.IsterError:
    """Any failure seen by the client as an IsterError (AioRpcError → its status; timeouts → Timeout;
    other transport-level surprises → retriable Unavailable)."""
    if isinstance(exc, errors.IsterError):
        return exc
    if isinstance(exc, grpc.aio.AioRpcError):
        return from_status(exc.code(), exc.details(), exc.trailing_metadata())
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return errors.Timeout(str(exc) or "operation timed out")
    err = ConnectionLost(f"connection failed: {type(exc).__name__}: {exc}")
    return err


def exhausted(err: errors.IsterError, budget: RetryBudget, what: str) -> errors.IsterError:
    """The error that ends a spent series of retries of `what` after the retriable `err`: Timeout or
    ResourceExhausted when `err` was one, Unavailable otherwise, saying what was tried, how often and for
    how long, and the last error. Still retriable: the caller may try again later."""
    cls: type[errors.IsterError] = errors.Unavailable
    if isinstance(err, errors.Timeout | errors.ResourceExhausted):
        cls = errors.Timeout if isinstance(err, errors.Timeout) else errors.ResourceExhausted
    out = cls(budget.spent(what, err))
    out.retriable = True
    return out


def is_retriable(err: errors.IsterError) -> bool:
    return bool(err.retriable)
