"""Object descriptors in the metadata store: which durable object holds which offsets.

Keys (metadata/keys.py):
    /danube-data/storage/topics/{ns}/{topic}/objects/{start:020}   descriptor (JSON, see ObjectDescriptor)
    /danube-data/storage/topics/{ns}/{topic}/objects/cur           {"start": "<20 digits>"}: the highest start

A descriptor is written only after its object is complete in the object store, then `cur` is advanced.
Descriptors never overlap: `record` refuses a range that overlaps a different descriptor.
"""

from __future__ import annotations

import asyncio
import contextlib
from bisect import bisect_right
from collections.abc import AsyncGenerator, Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ister.errors import FailedPrecondition, InvalidArgument, MetadataError
from ister.metadata import keys
from ister.metadata.keys import TopicLike
from ister.metadata.store import MetadataStore

from .segment import object_name

DEFAULT_METADATA_TIMEOUT = 10.0
LIST_PAGE = 1000
FIRST_PAGE = 16
CUR_ATTEMPTS = 8
MAX_DESCRIPTOR_INDEX = 1024  # entries of a descriptor's offset_index (the object has the full index)
_U64_MAX = 2**64 - 1

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ObjectDescriptor:
    object_id: str  # "data-<start>-<end>.dnb1"
    key: str  # the object's key in the object store (relative to the store URL)
    start_offset: int
    end_offset: int  # inclusive
    size: int
    etag: str | None
    created_at: int  # unix seconds
    completed: bool = True
    # (offset, byte position) pairs, a copy (thinned) of the object's own sparse index; advisory
    offset_index: tuple[tuple[int, int], ...] = ()
    # The lowest and highest publish time (Unix ms) of the object's records; None in descriptors written
    # before they were kept (a reader then treats the range as unknown). Time lookups and retention use them.
    min_publish_time_ms: int | None = None
    max_publish_time_ms: int | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.start_offset <= self.end_offset <= _U64_MAX:
            raise InvalidArgument(f"invalid descriptor range {self.start_offset}..{self.end_offset}")
        lo, hi = self.min_publish_time_ms, self.max_publish_time_ms
        if (lo is None) != (hi is None) or (lo is not None and hi is not None and not 0 <= lo <= hi):
            raise InvalidArgument(f"invalid descriptor publish-time range {lo}..{hi}")
        if self.object_id != object_name(self.start_offset, self.end_offset):
            raise InvalidArgument(f"descriptor object_id {self.object_id!r} does not match its range")
        if not self.key.endswith(self.object_id) or self.size < 1:
            raise InvalidArgument(f"invalid descriptor key {self.key!r} or size {self.size}")

    @property
    def count(self) -> int:
        return self.end_offset - self.start_offset + 1

    def same_object(self, other: ObjectDescriptor) -> bool:
        return (self.start_offset, self.end_offset, self.key) == (
            other.start_offset,
            other.end_offset,
            other.key,
        )

    def to_json(self) -> dict[str, Any]:
        value: dict[str, Any] = {
            "object_id": self.object_id,
            "key": self.key,
            "start_offset": self.start_offset,
            "end_offset": self.end_offset,
            "size": self.size,
            "etag": self.etag,
            "created_at": self.created_at,
            "completed": self.completed,
        }
        if self.offset_index:
            value["offset_index"] = [[o, p] for o, p in self.offset_index]
        if self.min_publish_time_ms is not None:
            value["min_publish_time_ms"] = self.min_publish_time_ms
            value["max_publish_time_ms"] = self.max_publish_time_ms
        return value

    @classmethod
    def from_json(cls, value: Any) -> ObjectDescriptor | None:
        """The descriptor, or None if `value` is not a well-formed completed descriptor."""
        if not isinstance(value, dict):
            return None
        try:
            ints = [value[k] for k in ("start_offset", "end_offset", "size", "created_at")]
            if any(isinstance(v, bool) or not isinstance(v, int) for v in ints):
                return None
            object_id, key, etag = value["object_id"], value["key"], value.get("etag")
            if not isinstance(object_id, str) or not isinstance(key, str):
                return None
            if etag is not None and not isinstance(etag, str):
                return None
            if value.get("completed") is not True:
                return None
            index = _parse_index(value.get("offset_index"))
            lo, hi = _parse_times(value)
            return cls(object_id, key, ints[0], ints[1], ints[2], etag, ints[3], True, index, lo, hi)
        except (KeyError, InvalidArgument):
            return None


def _parse_times(value: dict[str, Any]) -> tuple[int | None, int | None]:
    """A descriptor's publish-time range, or (None, None) when absent or malformed (a hint, like the
    offset index: a bad one must not hide the object)."""
    lo, hi = value.get("min_publish_time_ms"), value.get("max_publish_time_ms")
    if any(isinstance(v, bool) or not isinstance(v, int) for v in (lo, hi)):
        return None, None
    assert isinstance(lo, int) and isinstance(hi, int)
    return (lo, hi) if 0 <= lo <= hi <= _U64_MAX else (None, None)


def _parse_index(raw: Any) -> tuple[tuple[int, int], ...]:
    """A descriptor's offset_index, or () when absent or malformed (it is only a hint)."""
    if not isinstance(raw, list):
        return ()
    out: list[tuple[int, int]] = []
    for entry in raw:
        if (
            not isinstance(entry, list)
            or len(entry) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in entry)
        ):
            return ()
        out.append((entry[0], entry[1]))
    return tuple(out)


def thin_index(
    index: Sequence[tuple[int, int]], limit: int = MAX_DESCRIPTOR_INDEX
) -> tuple[tuple[int, int], ...]:
    """At most `limit` entries of a sparse index, evenly spread, always keeping the first."""
    if len(index) <= limit:
        return tuple(index)
    step = -(-len(index) // limit)
    return tuple(index[::step])


async def _bounded(awaitable: Awaitable[T], timeout: float, what: str) -> T:  # noqa: ASYNC109
    try:
        async with asyncio.timeout(timeout):
            return await awaitable
    except TimeoutError:
        raise MetadataError(f"metadata store: {what} timed out after {timeout:g} s") from None


async def _well_formed(
    store: MetadataStore,
    topic: TopicLike,
    page_size: int,
    timeout: float,  # noqa: ASYNC109 (per metadata call)
) -> AsyncGenerator[ObjectDescriptor, None]:
    """The topic's well-formed descriptors in key order (= start-offset order: keys end in 20 digits),
    skipping `cur`, unparsable values, incomplete descriptors and values whose start differs from their
    key; reads pages of `page_size` keys as far as the caller iterates."""
    prefix = keys.storage_objects_prefix(topic)
    after: str | None = None
    while True:
        page = await _bounded(
            store.list(prefix, limit=page_size, start_after=after), timeout, f"list {prefix}"
        )
        for kv in page:
            starts = keys.storage_object_starts([kv.key], topic)
            desc = ObjectDescriptor.from_json(kv.value)
            if desc is not None and starts == [desc.start_offset]:
                yield desc
        if len(page) < page_size:
            return
        after = page[-1].key


async def list_descriptors(
    store: MetadataStore,
    topic: TopicLike,
    *,
    timeout: float = DEFAULT_METADATA_TIMEOUT,  # noqa: ASYNC109 (per metadata call)
) -> list[ObjectDescriptor]:
    """Every well-formed descriptor of the topic, sorted by start offset."""
    found = [d async for d in _well_formed(store, topic, LIST_PAGE, timeout)]
    found.sort(key=lambda d: d.start_offset)
    return found


async def first_descriptor(
    store: MetadataStore,
    topic: TopicLike,
    *,
    timeout: float = DEFAULT_METADATA_TIMEOUT,  # noqa: ASYNC109 (per metadata call)
) -> ObjectDescriptor | None:
    """The descriptor with the lowest start offset, or None when the topic has none; normally reads one
    short page."""
    async with contextlib.aclosing(_well_formed(store, topic, FIRST_PAGE, timeout)) as descriptors:
        async for desc in descriptors:
            return desc
    return None


def covering(descriptors: Sequence[ObjectDescriptor], offset: int) -> ObjectDescriptor | None:
    """The descriptor whose range holds `offset` (descriptors sorted by start), or None."""
    i = bisect_right(descriptors, offset, key=lambda d: d.start_offset) - 1
    if i >= 0 and descriptors[i].end_offset >= offset:
        return descriptors[i]
    return None


def next_descriptor(descriptors: Sequence[ObjectDescriptor], offset: int) -> ObjectDescriptor | None:
    """The first descriptor that holds `offset` or starts after it (descriptors sorted by start)."""
    i = bisect_right(descriptors, offset, key=lambda d: d.start_offset) - 1
    if i >= 0 and descriptors[i].end_offset >= offset:
        return descriptors[i]
    return descriptors[i + 1] if i + 1 < len(descriptors) else None


def check_no_overlap(descriptors: Sequence[ObjectDescriptor], new: ObjectDescriptor) -> bool:
    """True if `new` is already recorded (same range and key); raises FailedPrecondition if it overlaps a
    different descriptor; False if it is new and fits."""
    for d in descriptors:
        if d.start_offset <= new.end_offset and new.start_offset <= d.end_offset:
            if d.same_object(new):
                return True
            raise FailedPrecondition(
                f"object {new.object_id} ({new.start_offset}..{new.end_offset}) overlaps the recorded "
                f"{d.object_id} ({d.start_offset}..{d.end_offset})"
            )
    return False


async def record(
    store: MetadataStore,
    topic: TopicLike,
    descriptor: ObjectDescriptor,
    *,
    existing: Sequence[ObjectDescriptor] | None = None,
    timeout: float = DEFAULT_METADATA_TIMEOUT,  # noqa: ASYNC109 (per metadata call)
) -> bool:
    """Record a descriptor (after its object is complete), then advance `cur`. Idempotent.

    `existing` is a fresh `list_descriptors` result (listed here when None). Returns True if the descriptor
    was written now, False if the same descriptor was already there. Raises FailedPrecondition if the range
    overlaps a different descriptor, MetadataError if the store fails or times out.
    """
    if existing is None:
        existing = await list_descriptors(store, topic, timeout=timeout)
    written = False
    if not check_no_overlap(existing, descriptor):
        key = keys.storage_object(topic, descriptor.start_offset)
        created = await _bounded(
            store.compare_and_set(key, descriptor.to_json(), expected_version=None), timeout, f"put {key}"
        )
        if not created:
            kv = await _bounded(store.get(key), timeout, f"get {key}")
            other = ObjectDescriptor.from_json(kv.value) if kv is not None else None
            if other is None or not other.same_object(descriptor):
                raise FailedPrecondition(f"{key} was recorded concurrently with a different object")
        written = created
    await advance_cur(store, topic, descriptor.start_offset, timeout=timeout)
    return written


def parse_cur(value: Any) -> int | None:
    if isinstance(value, dict) and isinstance(value.get("start"), str):
        text = value["start"]
        if len(text) == keys.OFFSET_DIGITS and text.isascii() and text.isdigit():
            return int(text)
    return None


async def read_cur(
    store: MetadataStore,
    topic: TopicLike,
    *,
    timeout: float = DEFAULT_METADATA_TIMEOUT,  # noqa: ASYNC109 (per metadata call)
) -> int | None:
    """The start offset `cur` points at, or None."""
    key = keys.storage_objects_cur(topic)
    kv = await _bounded(store.get(key), timeout, f"get {key}")
    return None if kv is None else parse_cur(kv.value)


async def advance_cur(
    store: MetadataStore,
    topic: TopicLike,
    start: int,
    *,
    timeout: float = DEFAULT_METADATA_TIMEOUT,  # noqa: ASYNC109 (per metadata call)
) -> None:
    """Make `cur` point at `start` unless it already points at a start >= `start` (never moves back)."""
    key = keys.storage_objects_cur(topic)
    value = {"start": keys.pad_offset(start)}
    for _ in range(CUR_ATTEMPTS):
        kv = await _bounded(store.get(key), timeout, f"get {key}")
        current = None if kv is None else parse_cur(kv.value)
        if current is not None and current >= start:
            return
        version = None if kv is None else kv.version
        if await _bounded(store.compare_and_set(key, value, expected_version=version), timeout, f"put {key}"):
            return
    raise MetadataError(f"{key}: gave up after {CUR_ATTEMPTS} concurrent updates")


__all__ = [
    "ObjectDescriptor",
    "advance_cur",
    "check_no_overlap",
    "covering",
    "first_descriptor",
    "list_descriptors",
    "next_descriptor",
    "parse_cur",
    "read_cur",
    "record",
    "thin_index",
]
