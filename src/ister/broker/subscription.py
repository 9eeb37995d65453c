"""What every subscription driver shares: its consumers, their streams, and the Exclusive admission rule."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

from ister.broker.sessions import ConsumerSession, ConsumerStream
from ister.core.dispatch import SubType
from ister.errors import FailedPrecondition

# A consumer that left an Exclusive subscription keeps it this long, so a reconnect with the same name wins
# over a newcomer; after that a consumer with another name may take the subscription over.
EXCLUSIVE_GRACE_SECONDS = 10.0


class Subscription(ABC):
    def __init__(self, topic: str, name: str, sub_type: SubType) -> None:
        self.topic = topic
        self.name = name
        self.sub_type = sub_type
        self.consumers: dict[int, ConsumerSession] = {}
        # Told "attach" or "detach" after a consumer's stream opened or ended (a partitioned subscription's
        # coordinator rebalances on it).
        self.on_change: Callable[[str], None] | None = None
        self.on_close: Callable[[], None] | None = None  # called once by close()
        self.messages_out = 0  # sent to consumers (redeliveries too), payload bytes: for the admin's stats
        self.bytes_out = 0

    # -- consumers -------------------------------------------------------------------------------------
    def find_consumer(self, consumer_name: str) -> ConsumerSession | None:
        for session in self.consumers.values():
            if session.name == consumer_name:
                return session
        return None

    def admit(self, consumer_name: str, sub_type: SubType) -> list[ConsumerSession]:
        """Check a new consumer may join; returns stale consumers it displaces (Exclusive takeover)."""
        others = [c for c in self.consumers.values() if c.name != consumer_name]
        if sub_type != self.sub_type and others:
            raise FailedPrecondition(
                f"subscription {self.name!r} on {self.topic} is {self.sub_type.name}; "
                f"cannot join it as {sub_type.name} while it has consumers"
            )
        if self.sub_type == SubType.EXCLUSIVE and others:
            live = [c for c in others if c.attached or c.idle_seconds() < EXCLUSIVE_GRACE_SECONDS]
            if live:
                raise FailedPrecondition(
                    f"subscription {self.name!r} on {self.topic} is Exclusive and consumer "
                    f"{live[0].name!r} holds it"
                )
            return others
        return []

    def add_consumer(self, session: ConsumerSession) -> None:
        self.consumers[session.id] = session
        self._on_add(session)

    def remove_consumer(self, session: ConsumerSession) -> None:
        self.detach(session)
        self.consumers.pop(session.id, None)
        self._on_remove(session)

    def attach(self, session: ConsumerSession, stream: ConsumerStream) -> None:
        """A ReceiveMessages stream opened for this consumer (a second one takes the first over)."""
        if session.stream is not None:
            old = session.stream
            session.stream = None
            old.end()
            self._on_detach(session)
        self._on_attach(session)  # may refuse (raises) before the stream counts as attached
        session.stream = stream
        session.connected_at = session.clock.time()
        session.touch()
        if self.on_change is not None:
            self.on_change("attach")

    def detach(self, session: ConsumerSession, stream: ConsumerStream | None = None) -> None:
        """The consumer's stream ended; a stale stream (already taken over) changes nothing."""
        if session.stream is None or (stream is not None and session.stream is not stream):
            return
        current = session.stream
        session.stream = None
        current.end()
        session.touch()
        self._on_detach(session)
        if self.on_change is not None:
            self.on_change("detach")

    # -- driver hooks ------------------------------------------------------------------------------------
    @property
    @abstractmethod
    def reliable(self) -> bool: ...

    @abstractmethod
    def _on_add(self, session: ConsumerSession) -> None: ...

    @abstractmethod
    def _on_remove(self, session: ConsumerSession) -> None: ...

    @abstractmethod
    def _on_attach(self, session: ConsumerSession) -> None: ...

    @abstractmethod
    def _on_detach(self, session: ConsumerSession) -> None: ...

    @abstractmethod
    async def ack(self, offset: int) -> bool: ...

    @abstractmethod
    async def nack(self, offset: int, delay_ms: int | None, reason: str | None) -> bool: ...

    async def poison(self, offset: int, reason: str) -> bool:
        """The message at `offset`, just handed to a consumer's stream, cannot be sent to it: reliable
        subscriptions apply the poison policy at once. True when this call handled it (log it then), False
        when the offset was no longer in flight. Non-reliable: the message is simply not delivered."""
        return True

    async def ack_range(self, first: int, last: int, consumer_id: int) -> int:
        """Acknowledge [first, last]; the batch API. Non-reliable: nothing to do."""
        return 0

    async def ack_upto(self, offset: int, consumer_id: int) -> int:
        """Acknowledge everything up to `offset` delivered to `consumer_id`."""
        return 0

    async def nack_range(
        self, first: int, last: int, consumer_id: int, delay_ms: int | None, reason: str | None
    ) -> int:
        return 0

    @property
    def epoch(self) -> int:
        """Changes at each cursor reset (reliable only): acks sent on streams opened before it are ignored."""
        return 0

    @property
    def window(self) -> int:
        """Messages in flight per subscription; 0 when the subscription has no window (non-reliable)."""
        return 0

    def set_window(self, window: int) -> None:  # noqa: B027 - an optional hook: only reliable ones have a window
        """Messages in flight per subscription (reliable only)."""

    @abstractmethod
    async def close(self) -> None:
        """Stop dispatching, persist progress, end every stream."""

    def end_streams(self) -> None:
        for session in list(self.consumers.values()):
            self.detach(session)
