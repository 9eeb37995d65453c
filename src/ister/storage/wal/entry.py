"""What the loop hands a WAL's writer (`Entry`), and the callbacks through which the writer reports back."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ister.errors import StorageError, StorageExhausted


class Entry:
    """One append call (count > 0) or a flush marker (count == 0, forces an fdatasync)."""

    __slots__ = ("count", "data", "first_offset", "future", "payload_bytes", "payloads")

    def __init__(
        self,
        first_offset: int,
        count: int,
        data: bytes,
        payloads: list[bytes] | None,  # None: frames appended as they came (not cached)
        payload_bytes: int,
        future: asyncio.Future[int] | None,
    ) -> None:
        self.first_offset = first_offset
        self.count = count
        self.data = data
        self.payloads = payloads
        self.payload_bytes = payload_bytes
        self.future = future


# (group, committed_end, synced_end, group_bytes) -> None, run on the loop thread
CommitCallback = Callable[[list[Entry], int, int, int], None]
# (entries that will never be written, error) -> None, run on the loop thread
FailureCallback = Callable[[list[Entry], StorageError], None]
# (entries refused for lack of space or descriptors, error, offset the next append must get) -> None
RefusedCallback = Callable[[list[Entry], StorageExhausted, int], None]
# (end, reset) -> None: a cut was made, or was attempted and failed (on_failure follows then)
CutCallback = Callable[[int, bool], None]
