"""Non-reliable (at-most-once) routing: one decision per message, nothing is tracked."""

from __future__ import annotations

from collections.abc import Iterable

from ister.core.dispatch.selector import ConsumerSelector
from ister.core.dispatch.types import SubType


class NonReliableRouter:
    """Routes each message to one attached consumer, or to nobody (the broker drops it)."""

    def __init__(self, sub_type: SubType) -> None:
        self._selector = ConsumerSelector(sub_type)

    @property
    def sub_type(self) -> SubType:
        return self._selector.sub_type

    def attach(self, consumer_id: int, key_filters: Iterable[str] = ()) -> None:
        self._selector.attach(consumer_id, key_filters)

    def detach(self, consumer_id: int) -> None:
        self._selector.detach(consumer_id)

    def remove(self, consumer_id: int) -> None:
        self._selector.remove(consumer_id)

    def route(self, key: str) -> int | None:
        """Which consumer gets this message now; None means drop it."""
        return self._selector.route(key)

    def active_consumer(self) -> int | None:
        return self._selector.active()

    def attached_consumers(self) -> list[int]:
        return self._selector.attached_ids()
