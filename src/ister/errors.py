"""The one error tree. Every layer raises these; `wire.status` maps them to gRPC status codes."""

from __future__ import annotations


class IsterError(Exception):
    """Base of every Ister error. `retriable` tells callers whether the same request may succeed later."""

    retriable: bool = False


class InvalidArgument(IsterError):
    """The request is malformed or violates a policy (bad name, oversize payload, bad config)."""


class NotFound(IsterError):
    """The named topic, namespace, producer, consumer or subscription does not exist."""


class AlreadyExists(IsterError):
    """Creating something that already exists."""


class FailedPrecondition(IsterError):
    """The request conflicts with existing state (strategy mismatch, exclusive subscription taken)."""


class OutOfOrderSequence(FailedPrecondition):
    """An idempotent producer's batch starts past the next sequence expected: messages before it never
    reached the broker (its message starts with "out of order sequence")."""


class DuplicateSequence(FailedPrecondition):
    """An idempotent producer's batch is stored already, but not as a batch the broker still remembers, so
    its offsets are unknown (its message starts with "duplicate sequence")."""


class Unauthenticated(IsterError):
    """The call carries no valid credentials (missing, malformed, expired or forged token; no client
    certificate where one is needed)."""


class PermissionDenied(IsterError):
    """The caller may not do this."""


class Unavailable(IsterError):
    """Not here or not now (topic not served by this broker, topic moving, broker shutting down)."""

    retriable = True


class Fenced(Unavailable):
    """This broker lost (or never had) ownership of the topic, or its lease may be gone: redo the lookup."""


class AskAnother(Unavailable):
    """This broker cannot tell who serves a topic now (it cannot renew its lease, so its view of the
    cluster may be stale): ask another broker. The status carries `ister-ask-another: true`, and the Ister
    client's next lookup goes to its next seed instead of this one."""


class ResourceExhausted(IsterError):
    """Back-pressure: a bounded queue, window or policy limit is full."""

    retriable = True


class QuotaExceeded(ResourceExhausted):
    """A policy limit only an operator or consumers can lift (a backlog quota): RESOURCE_EXHAUSTED, but the
    Ister client reports it at once instead of retrying (the status carries `ister-retriable: false`)."""

    retriable = False


class Timeout(IsterError):
    """An operation did not finish within its deadline."""

    retriable = True


class StartTimeout(IsterError):
    """A broker did not reach what it needs to start (etcd, the object store) within its start timeout."""


class StorageError(IsterError):
    """The WAL or another storage component failed."""


class CorruptionError(StorageError):
    """Data read from disk failed validation (bad checksum, impossible length, offset out of order)."""


class CorruptRange(CorruptionError):
    """Offsets [first, end) of a log are damaged or lost on disk (a bad frame in a closed segment, a
    truncated segment below the acknowledged high-water mark): they cannot be read from there."""

    def __init__(self, message: str, first: int = 0, end: int = 0) -> None:
        super().__init__(message)
        self.first = first
        self.end = end  # exclusive


class StorageExhausted(StorageError, ResourceExhausted):
    """A storage resource ran out (disk space, quota, file descriptors): nothing was written; the same
    request may succeed once it returns. Maps to RESOURCE_EXHAUSTED (retriable), not INTERNAL."""

    retriable = True


class DiskFull(StorageExhausted):
    """The disk (or quota) is full: nothing was written; the same request may succeed once space returns."""


class OffsetOutOfRange(StorageError):
    """A reader asked for an offset that is no longer (or not yet) stored."""


class DataLoss(IsterError):
    """A reader's position is no longer readable (retention passed it, the topic is gone or re-created)."""


class LogTruncated(DataLoss):
    """The log was cut below a reader's position (a replica truncated records its leader never committed):
    the records it returned from there on are gone, and the offsets will hold other records."""


class MetadataError(IsterError):
    """The metadata store failed or is unreachable."""

    retriable = True


class MetadataUnusable(MetadataError):
    """The metadata store is there but cannot be used with these settings (TLS to etcd that does not match
    its server): a retry does not help, so a starting broker stops at once instead of waiting."""

    retriable = False


class WatchLagged(MetadataError):
    """A metadata watcher fell behind its bounded queue and must resynchronise."""


class ConfigError(IsterError):
    """Configuration is invalid; the message names the key and the reason."""
