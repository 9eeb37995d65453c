"""Object-store request and error counters (docs/metrics.md), by operation."""

from __future__ import annotations

from prometheus_client import Counter

from ister.errors import NotFound, StorageError

requests = Counter(
    "ister_object_store_requests", "Object-store operations started, by operation", ("operation",)
)
errors = Counter(
    "ister_object_store_errors",
    "Object-store operations that failed, by operation and error: not_found (a missing object, often "
    "expected), unavailable (network, timeout, 5xx: retried), failed (denied, conflict, bad request)",
    ("operation", "error"),
)
OPERATIONS = ("put", "get", "head", "list", "delete")
for _op in OPERATIONS:  # exported as 0 from the start, so rate() and alerts see them before a failure
    requests.labels(_op)
    for _err in ("not_found", "unavailable", "failed"):
        errors.labels(_op, _err)


def count_error(operation: str, exc: BaseException) -> None:
    """Count a failed operation by the kind of its (translated) error."""
    if isinstance(exc, NotFound):
        kind = "not_found"
    elif isinstance(exc, StorageError) and exc.retriable:
        kind = "unavailable"
    else:
        kind = "failed"
    errors.labels(operation, kind).inc()
