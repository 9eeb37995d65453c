"""The error ⇄ gRPC status table. Codes follow what the official Danube client depends on
(docs/architecture.md §7)."""

from __future__ import annotations

import grpc

from ister import errors

_TABLE: tuple[tuple[type[errors.IsterError], grpc.StatusCode], ...] = (
    (errors.InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.ConfigError, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.NotFound, grpc.StatusCode.NOT_FOUND),
    (errors.AlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
    (errors.FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (errors.Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (errors.Unavailable, grpc.StatusCode.UNAVAILABLE),
    (errors.ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.Timeout, grpc.StatusCode.DEADLINE_EXCEEDED),
    (errors.OffsetOutOfRange, grpc.StatusCode.OUT_OF_RANGE),
    (errors.DataLoss, grpc.StatusCode.DATA_LOSS),
    (errors.MetadataError, grpc.StatusCode.UNAVAILABLE),
    (errors.StorageError, grpc.StatusCode.INTERNAL),
)


def status_for(exc: errors.IsterError) -> grpc.StatusCode:
    if isinstance(exc, errors.MetadataError) and not exc.retriable:
        return grpc.StatusCode.INTERNAL  # e.g. a lease that is gone: retrying the same call cannot help
    for kind, code in _TABLE:
        if isinstance(exc, kind):
            return code
    return grpc.StatusCode.INTERNAL
