"""What a placement needs from the broker service that hosts the topics (`BrokerService` implements it)."""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol


class TopicStats(Protocol):
    """What the cluster's load report reads of a loaded topic (ister.broker.topic.Topic)."""

    messages_in: int
    bytes_in: int

    @property
    def producers(self) -> dict[int, Any]: ...

    @property
    def subscriptions(self) -> dict[str, Any]: ...


class TopicHost(Protocol):
    def is_loaded(self, topic: str) -> bool: ...

    def load_snapshot(self) -> Iterable[tuple[str, TopicStats, int]]:
        """(name, topic, backlog) of every loaded topic."""

    async def load_assigned(self, topic: str) -> None: ...

    async def unload(self, topic: str, reason: str) -> None: ...

    async def seal(self, topic: str, reason: str) -> None: ...

    def check_topic_room(self, count: int, what: str) -> None: ...

    def topic_lock(self, name: str) -> AbstractAsyncContextManager[None]:
        """Held while the topic is loaded or its local files are changed."""
