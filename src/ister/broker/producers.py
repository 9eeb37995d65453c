"""Producers: created on a topic (which fixes its delivery), found again by name, id or after a restart."""

from __future__ import annotations

from ister.broker.ownership import Ownership
from ister.broker.sessions import ProducerSession
from ister.broker.topic import NON_RELIABLE, RELIABLE, Topic
from ister.broker.topics import TopicRegistry
from ister.core.record import StoredMessage
from ister.errors import FailedPrecondition, InvalidArgument, NotFound
from ister.ids import TopicName, new_id, shown, validate_client_name
from ister.metadata import keys
from ister.metadata.records import ProducerRecord
from ister.metadata.store import MetadataStore


class Producers:
    def __init__(self, store: MetadataStore, topics: TopicRegistry, ownership: Ownership) -> None:
        self.store = store
        self.topics = topics
        self.ownership = ownership
        self.sessions: dict[int, ProducerSession] = {}

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
            return existing.id
        policy = await self.topics.namespace_policy(name.namespace)
        limit = policy.max_producers_per_topic
        if limit and len(topic.producers) >= limit:
            raise FailedPrecondition(f"topic {name} already has max_producers_per_topic={limit} producers")
        session = ProducerSession(new_id(), producer_name, name.full, access_mode)
        record = ProducerRecord(
            producer_id=session.id, producer_name=producer_name, topic_name=name.full, access_mode=access_mode
        )
        await self.store.put(keys.topic_producer(name.full, session.id), record.to_json())
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
            if topic_name:
                raise self.ownership.not_served_error(f"producer {producer_id}")
            raise NotFound(f"producer {producer_id} does not exist on this broker")
        if topic_name and topic_name != session.topic:
            raise InvalidArgument(
                f"producer {producer_id} publishes to {session.topic}, not {shown(topic_name)}"
            )
        return session

    async def send(self, session: ProducerSession, message: StoredMessage) -> int:
        """Publish for a producer already resolved by `find()`; the hot path avoids re-parsing names."""
        topic = self.topics.topics.get(session.topic)
        if topic is None:
            topic = await self.topics.get(TopicName.parse(session.topic))
        return await topic.publish(message)
