"""Names and their parsers: topics (`/namespace/topic`), partitions (`-part-N`), and client-chosen names.

Everything that arrives from the network passes through here before it reaches a metadata key or a path.
"""

from __future__ import annotations

import os
import random
import re
import secrets
from dataclasses import dataclass

from ister.errors import InvalidArgument
from ister.limits import MAX_ECHO_CHARS, MAX_NAME_LEN

_SEGMENT = re.compile(r"[A-Za-z0-9_-]+")
_PARTITION = re.compile(r"^(?P<base>.+)-part-(?P<index>0|[1-9][0-9]{0,5})$")
# Client-chosen names (producer, consumer, subscription) become metadata key segments:
# no '/', no control characters.
_CLIENT_NAME = re.compile(r"[^/\x00-\x1f\x7f]+")

PARTITION_MARKER = "-part-"


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """`1 message`, `2 messages`: a count with its noun, plural (default: noun + s) unless it is one."""
    return f"{n} {noun}" if n == 1 else f"{n} {plural or noun + 's'}"


def shown(value: object, limit: int = MAX_ECHO_CHARS) -> str:
    """Client input quoted for an error message: its repr, cut to about `limit` characters.

    Every message that echoes what a client sent goes through here. A long echo would not fit in gRPC's
    metadata, and the client would then see RESOURCE_EXHAUSTED (which the Danube client retries for ever)
    instead of the error; a cut one says how long the original was."""
    if isinstance(value, str | bytes):
        if len(value) <= limit:
            return repr(value)
        return f"{value[:limit]!r}... ({len(value)} {'characters' if isinstance(value, str) else 'bytes'})"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def clip(text: str, limit: int = MAX_ECHO_CHARS) -> str:
    """Free text that may contain client input (a decoder's message, a nested error), cut to `limit`."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def validate_segment(value: str, what: str) -> str:
    if not value or len(value) > MAX_NAME_LEN or not _SEGMENT.fullmatch(value):
        raise InvalidArgument(
            f"invalid {what} {shown(value)}: "
            f"use 1-{MAX_NAME_LEN} characters from letters, digits, '_' and '-'"
        )
    return value


def validate_client_name(value: str, what: str) -> str:
    if not value or len(value) > MAX_NAME_LEN or not _CLIENT_NAME.fullmatch(value):
        raise InvalidArgument(
            f"invalid {what} {shown(value)}: 1-{MAX_NAME_LEN} characters, no '/' and no control characters"
        )
    return value


@dataclass(frozen=True, slots=True)
class TopicName:
    """A validated topic name `/namespace/topic`; partitions are ordinary topics named `<base>-part-N`."""

    namespace: str
    topic: str

    @classmethod
    def parse(cls, raw: str) -> TopicName:
        parts = raw.split("/")
        if len(parts) != 3 or parts[0] != "":
            raise InvalidArgument(f"invalid topic name {shown(raw)}: expected '/namespace/topic'")
        validate_segment(parts[1], "namespace")
        validate_segment(parts[2], "topic")
        return cls(parts[1], parts[2])

    @property
    def full(self) -> str:
        return f"/{self.namespace}/{self.topic}"

    @property
    def path(self) -> str:
        """Storage-facing form `namespace/topic`."""
        return f"{self.namespace}/{self.topic}"

    @property
    def partition(self) -> tuple[str, int] | None:
        """(base topic, index) when this is a partition topic, else None."""
        m = _PARTITION.match(self.topic)
        if m is None:
            return None
        return m.group("base"), int(m.group("index"))

    def partition_topic(self, index: int) -> TopicName:
        return TopicName(self.namespace, f"{self.topic}{PARTITION_MARKER}{index}")

    def dlq(self) -> TopicName:
        """The default dead-letter topic `<topic>-DLQ`; InvalidArgument when that name would be too long."""
        return TopicName(self.namespace, validate_segment(f"{self.topic}-DLQ", "dead-letter topic"))

    def __str__(self) -> str:
        return self.full


# Ids need to be unique, not secret: a generator seeded once from the OS, so handing one out is no system call
# (a call that releases the GIL, which the event loop then waits to get back behind busy threads).
_ids = random.Random(secrets.randbits(128))
os.register_at_fork(after_in_child=lambda: _ids.seed(secrets.randbits(128)))  # a forked child draws its own


def new_id() -> int:
    """A random non-zero u64 id (producers, consumers, brokers), as Danube hands out."""
    while True:
        value = _ids.getrandbits(64)
        if value:
            return value
