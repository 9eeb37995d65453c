"""Producers: created on a topic (which fixes its delivery), found again by name, id or after a restart."""

from __future__ import annotations

import logging
from collections import OrderedDict

from ister.broker import metrics
from ister.broker.sessions import ProducerSession
from ister.broker.topic import NON_RELIABLE, RELIABLE, Topic
from ister.broker.topics import TopicRegistry
from ister.clock import REAL_CLOCK, Clock
from ister.core.record import StoredMessage
from ister.errors import FailedPrecondition, InvalidArgument, MetadataError, NotFound, Unavailable
from ister.ids import TopicName, new_id, shown, validate_client_name
from ister.metadata import keys
from ister.metadata.records import ProducerRecord
from ister.metadata.store import MetadataStore
from ister.ports.placement import Placement

log = logging.getLogger(__name__)

FORGOTTEN_REMEMBERED = 65_536  # ids of forgotten producers, answered UNAVAILABLE (not NOT_FOUND) on return


class Producers:
    def __init__(
        self, store: MetadataStore, topics: TopicRegistry, placement: Placement, clock: Clock = REAL_CLOCK
    ) -> None:
        self.store = store
        self.clock = clock
        self.topics = topics
        self.placement = placement
        self.sessions: dict[int, ProducerSession] = {}
        self._forgotten: OrderedDict[int, None] = OrderedDict()  # ids `reap` forgot, oldest first

    def register(self, session: ProducerSession) -> None:
        self.sessions[session.id] = session

    def forget(self, topic: Topic) -> None:
        for pid in list(topic.producers):
            self.sessions.pop(pid, None)

    async def create(self, topic_name: str, producer_name: str, reliable: bool, access_mode: int) -> int:
        name = TopicName.parse(topic_name)
        validate_client_name(producer_name, "producer name")
        wanted = RELIABLE if reliable else NON_RELIABLE
        topic = await self.topics.get(name, create_as=wanted)
        if topic.delivery != wanted:
            raise FailedPrecondition(
                f"topic {name} is {topic.delivery} (fixed by its first producer); "
                f"this producer asked for {wanted}"
            )
        existing = topic.producer_by_name(producer_name)
        if existing is not None:
            existing.touch()
            return existing.id
        policy = await self.topics.namespace_policy(name.namespace)
        limit = policy.max_producers_per_topic
        if limit and len(topic.producers) >= limit:
            metrics.limit_refusals.labels("max_producers_per_topic").inc()
            raise FailedPrecondition(
                f"{name}: namespace {name.namespace} allows max_producers_per_topic={limit} producers; "
                f"it has {len(topic.producers)}"
            )
        session = ProducerSession(new_id(), producer_name, name.full, access_mode, clock=self.clock)
        await self.store.put(keys.topic_producer(name.full, session.id), _record_of(session).to_json())
        topic.producers[session.id] = session
        self.sessions[session.id] = session
        return session.id

    async def find(self, producer_id: int, topic_name: str) -> ProducerSession:
        session = self.sessions.get(producer_id)
        if session is None and topic_name:
            # After a restart the topic may not be loaded yet: loading it restores its producers.
            try:
                name = TopicName.parse(topic_name)
            except InvalidArgument:
                name = None
            if (
                name is not None
                and await self.store.get(keys.topic_producer(name.full, producer_id)) is not None
            ):
                await self.topics.get(name)
                session = self.sessions.get(producer_id)
        if session is None:
            if producer_id in self._forgotten:
                # Its client went quiet and came back: UNAVAILABLE makes the official client create it again.
                raise Unavailable(f"producer {producer_id} was idle and has been closed; create it again")
            if topic_name:
                raise self.placement.not_served_error(f"producer {producer_id}")
            raise NotFound(f"producer {producer_id} does not exist on this broker")
        if topic_name and topic_name != session.topic:
            raise InvalidArgument(
                f"producer {producer_id} publishes to {session.topic}, not {shown(topic_name)}"
            )
        session.touch()
        return session

    async def reap(self, seen_before: float) -> int:
        """Forget producers with no open Publish stream that were last seen (a send, a health check, a stream
        closing) before `seen_before` (monotonic seconds): their record in the metadata, then the session.

        Producers are never closed by the official client and a name seen once stayed forever: in memory, in
        the metadata, and counted by `max_producers_per_topic`, which then refused new producers for good.
        A live Danube producer health-checks every 5 s and a batch-API one keeps its stream open, so only
        producers whose client is gone (or whose health checks stopped) are forgotten; one that sends again
        gets UNAVAILABLE, on which the official client creates its producer again. A metadata store that
        cannot be written keeps the session until a later pass succeeds."""
        stale = [s for s in self.sessions.values() if not s.attached and s.last_seen < seen_before]
        forgotten = 0
        for session in stale:
            key = keys.topic_producer(session.topic, session.id)
            try:
                await self.store.delete(key)
                if session.attached or session.last_seen >= seen_before:
                    # Used again while its record was being deleted: it stays, and so does its record.
                    await self.store.put(key, _record_of(session).to_json())
                    continue
            except MetadataError as exc:
                log.warning("could not forget idle producer %d of %s yet: %s", session.id, session.topic, exc)
                continue
            topic = self.topics.topics.get(session.topic)
            if topic is not None:
                topic.producers.pop(session.id, None)
            self.sessions.pop(session.id, None)
            self._forgotten[session.id] = None
            if len(self._forgotten) > FORGOTTEN_REMEMBERED:
                self._forgotten.popitem(last=False)
            forgotten += 1
        if forgotten:
            log.info("forgot %d idle producers", forgotten)
        return forgotten

    async def send(self, session: ProducerSession, message: StoredMessage) -> int:
        """Publish for a producer already resolved by `find()`; the hot path avoids re-parsing names."""
        topic = self.topics.topics.get(session.topic)
        if topic is None:
            topic = await self.topics.get(TopicName.parse(session.topic))
        topic.check_size(len(message.payload))
        await topic.admit(1, len(message.payload))
        return await topic.publish(message)


def _record_of(session: ProducerSession) -> ProducerRecord:
    return ProducerRecord(
        producer_id=session.id,
        producer_name=session.name,
        topic_name=session.topic,
        access_mode=session.access_mode,
    )
