"""zstd dictionaries on the client side (docs/compression.md, "Dictionaries").

A consumer that sets `accept_dictionaries` gets records compressed with a topic's dictionary as stored; a
producer with zstd learns its topic's dictionary from PublishOpened / PublishAck. Either fetches a
dictionary it lacks from the broker serving the topic (Ister.GetCompressionDictionary) into the process's
`core.zdict.REGISTRY`, which `core.compression` decompresses with. Dictionaries never change (an id names
the same bytes forever), so what is loaded stays; concurrent needs of one id share one fetch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ister import errors
from ister.core import zdict
from ister.core.compression import MissingDictionary
from ister.wire.gen import ister_v1_pb2 as pb

if TYPE_CHECKING:
    from ister.client.connection import ClientConnection

T = TypeVar("T")
FETCH_TIMEOUT_SECONDS = 10.0  # one GetCompressionDictionary call (16 KiB from memory)


class Dictionaries:
    """Fetches dictionaries on demand into a registry (the process's by default)."""

    def __init__(self, client: ClientConnection, registry: zdict.DictionaryRegistry = zdict.REGISTRY) -> None:
        self._client = client
        self.registry = registry
        self._fetching: dict[int, asyncio.Task[None]] = {}
        self.fetched = 0  # dictionaries this client fetched (tests, benchmarks)

    async def ensure(self, topic: str, dict_id: int) -> None:
        """Return once dictionary `dict_id` is loaded: at once when it is, else after fetching it from the
        broker serving `topic` (retriable failures retried within the client's retry budget). NotFound when
        the broker does not hold it for that topic's namespace, CorruptionError when what it sends is not
        that dictionary, Unavailable when the retries are spent."""
        if dict_id in self.registry:
            return
        task = self._fetching.get(dict_id)
        if task is None:
            task = asyncio.create_task(self._fetch(topic, dict_id), name=f"ister-dictionary:{dict_id}")
            self._fetching[dict_id] = task
            task.add_done_callback(lambda t: self._done(dict_id, t))
        await asyncio.shield(task)

    async def decode(self, topic: str, decode: Callable[[], T]) -> T:
        """`decode()` (a batch's decoding, which has no side effects until it returns), run again after
        fetching each dictionary it misses. Each round loads one more id, so it ends; nothing is decoded,
        delivered or acknowledged with a dictionary missing: a failed fetch raises and the records stay
        unacknowledged (the broker delivers them again)."""
        loaded: set[int] = set()
        while True:
            try:
                return decode()
            except MissingDictionary as exc:
                if exc.dict_id in loaded:  # loaded into another registry than the one decoding uses
                    raise errors.CorruptionError(f"{topic}: {exc} (after fetching it)") from None
                await self.ensure(topic, exc.dict_id)
                loaded.add(exc.dict_id)

    def _done(self, dict_id: int, task: asyncio.Task[None]) -> None:
        self._fetching.pop(dict_id, None)
        if not task.cancelled():
            task.exception()  # retrieved: a caller cancelled meanwhile must not leave it unobserved

    async def _fetch(self, topic: str, dict_id: int) -> None:
        request = pb.GetCompressionDictionaryRequest(id=dict_id, topic=topic)

        async def call(stub: Any) -> Any:
            return await stub.GetCompressionDictionary(request, timeout=FETCH_TIMEOUT_SECONDS)

        what = f"fetching zstd dictionary {dict_id}"
        try:
            resp = await self._client._on_owner(topic, call, what)
        except errors.NotFound as exc:
            raise errors.NotFound(
                f"{topic}: records need zstd dictionary {dict_id}, which the broker does not give: {exc}"
            ) from None
        data = bytes(resp.dictionary)
        try:
            if zdict.load_id(data) != dict_id or int(resp.id) != dict_id:
                raise zdict.DictionaryError(f"asked for dictionary {dict_id}, got {zdict.load_id(data)}")
            self.registry.add(data)
        except zdict.DictionaryError as exc:
            raise errors.CorruptionError(f"{topic}: {what}: the broker's answer is unusable: {exc}") from None
        self.fetched += 1
