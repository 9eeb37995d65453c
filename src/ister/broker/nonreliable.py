"""Non-reliable subscriptions: straight to a connected consumer's bounded buffer, or dropped."""

from __future__ import annotations

from ister.broker import metrics
from ister.broker.sessions import ConsumerSession, Outbound, Record
from ister.broker.subscription import Subscription
from ister.core.dispatch import NonReliableRouter, SubType
from ister.core.record import StoredMessage


class NonReliableSubscription(Subscription):
    def __init__(self, topic: str, name: str, sub_type: SubType) -> None:
        super().__init__(topic, name, sub_type)
        self._router = NonReliableRouter(sub_type)
        self._dropped = metrics.dropped.labels(topic, name)
        self._out = metrics.messages_out.labels(topic, name)

    @property
    def reliable(self) -> bool:
        return False

    def _on_add(self, session: ConsumerSession) -> None:
        pass

    def _on_remove(self, session: ConsumerSession) -> None:
        self._router.remove(session.id)

    def _on_attach(self, session: ConsumerSession) -> None:
        self._router.attach(session.id, session.key_filters)

    def _on_detach(self, session: ConsumerSession) -> None:
        self._router.detach(session.id)

    def dispatch(self, offset: int, message: StoredMessage, record: Record) -> None:
        """At-most-once: one routing decision, one non-blocking enqueue."""
        cid = self._router.route(message.key)
        session = self.consumers.get(cid) if cid is not None else None
        if (
            session is None
            or session.stream is None
            or not session.stream.offer(Outbound(offset, record, message=message))
        ):
            self._dropped.inc()
            return
        self._out.inc()
        self.messages_out += 1
        self.bytes_out += len(message.payload)

    async def ack(self, offset: int) -> bool:
        return True  # the official client acks everything; nothing is tracked here

    async def nack(self, offset: int, delay_ms: int | None, reason: str | None) -> bool:
        return True

    async def close(self) -> None:
        self.end_streams()
        metrics.forget_subscription(self.topic, self.name)
