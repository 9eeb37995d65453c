"""Topic bindings of the schema registry (registry.py): which subject a topic's messages use and how they
are checked, kept in one key per bound topic that every broker watches."""

from __future__ import annotations

import functools

from ister.core.schema import (
    ValidationPolicy,
)
from ister.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable
from ister.ids import TopicName, shown
from ister.metadata import keys
from ister.metadata.store import Compare, Op, Put
from ister.schema.records import (
    TopicBinding,
)
from ister.schema.registry_reads import BINDINGS_PREFIX, CAS_ATTEMPTS, PARSED_CACHE, SchemaReads


def binding_key(topic: TopicName) -> str:
    return f"{BINDINGS_PREFIX}{topic.namespace}/{topic.topic}"


@functools.lru_cache(maxsize=PARSED_CACHE)
def _binding_key_of(topic: str) -> str | None:
    """`binding_key` of a topic name as sent (None if it is not one): every publish asks, and most topics
    have no binding, so the parse is kept."""
    try:
        return binding_key(TopicName.parse(topic))
    except InvalidArgument:
        return None


class TopicBindings(SchemaReads):
    def binding(self, topic: str) -> TopicBinding | None:
        """The topic's binding as this broker's watch last saw it (no I/O: the publish path)."""
        hit = self._bindings_parsed.get(topic)
        key = hit[0] if hit is not None else _binding_key_of(topic)
        if key is None:
            return None
        kv = self.bindings.get(key)
        if kv is None or kv.value is None:
            return None
        if hit is not None and hit[1] is kv:
            return hit[2]
        binding = TopicBinding.from_json(kv.value)
        if len(self._bindings_parsed) > PARSED_CACHE:
            self._bindings_parsed.clear()
        self._bindings_parsed[topic] = (key, kv, binding)
        return binding

    async def topic_binding(self, topic: str) -> TopicBinding | None:
        name = TopicName.parse(topic)
        kv = await self.store.get(keys.topic_schema_config(name))
        return TopicBinding.from_json(kv.value) if kv is not None and kv.value else None

    async def bind_topic(
        self,
        topic: str,
        subject: str,
        policy: ValidationPolicy,
        payload_validation: bool,
        *,
        only_if_unbound: bool = False,
    ) -> TopicBinding:
        """Bind a topic to a subject with a policy (ConfigureTopicSchema, admin CreateTopic, a producer
        naming a subject for an unbound topic). The topic must exist; so must the subject."""
        name = TopicName.parse(topic)
        if not await self.topic_exists(name):
            raise NotFound(f"topic {name} does not exist")
        config_key = keys.topic_schema_config(name)
        for _ in range(CAS_ATTEMPTS):
            metadata, meta_version = await self._metadata(subject)
            current = await self.store.get(config_key)
            previous = (
                TopicBinding.from_json(current.value) if current is not None and current.value else None
            )
            if only_if_unbound and previous is not None:
                if previous.subject != subject:
                    raise FailedPrecondition(
                        f"topic {name} uses schema subject {shown(previous.subject)}, not {shown(subject)}"
                    )
                return previous
            binding = TopicBinding(subject, int(metadata.get("id", 0)), policy, payload_validation)
            compares = [Compare(config_key, current.version if current is not None else None)]
            using = list(metadata.get("topics_using") or [])
            ops: list[Op] = [
                Put(config_key, binding.to_json()),
                Put(keys.topic_schema_subject(name), subject),
                Put(binding_key(name), binding.to_json()),
            ]
            if name.full not in using:
                compares.append(Compare(keys.schema_metadata(subject), meta_version))
                ops.append(
                    Put(keys.schema_metadata(subject), {**metadata, "topics_using": [*using, name.full]})
                )
            if previous is not None and previous.subject != subject:
                old = await self.store.get(keys.schema_metadata(previous.subject))
                if old is not None and isinstance(old.value, dict):
                    old_using = [t for t in old.value.get("topics_using") or [] if t != name.full]
                    compares.append(Compare(old.key, old.version))
                    ops.append(Put(old.key, {**old.value, "topics_using": old_using}))
            if await self.store.txn(compares, ops):
                await self._seen(name, binding)
                return binding
        raise Unavailable(f"topic {name} schema config kept changing; try again")

    async def require_subject(self, subject: str) -> None:
        await self._metadata(subject)

    async def check_producer(self, topic: str, subject: str) -> None:
        """Before a producer naming `subject` attaches (CreateProducer's schema_ref): the subject is
        registered, and the topic, if bound already, is bound to it. Nothing is written."""
        try:
            await self._metadata(subject)
        except NotFound:
            raise FailedPrecondition(
                f"schema subject {shown(subject)} is not registered: register it before producing with it"
            ) from None
        current = await self.topic_binding(TopicName.parse(topic).full)
        if current is not None and current.subject != subject:
            raise FailedPrecondition(
                f"topic {topic} uses schema subject {shown(current.subject)}, not {shown(subject)}: "
                "only an admin changes a topic's subject"
            )

    async def attach_producer(self, topic: str, subject: str) -> None:
        """After the producer attached: an unbound topic is bound to its subject (policy none)."""
        if await self.topic_binding(TopicName.parse(topic).full) is None:
            await self.bind_topic(topic, subject, ValidationPolicy.NONE, False, only_if_unbound=True)

    async def update_policy(
        self, topic: str, policy: ValidationPolicy, payload_validation: bool
    ) -> TopicBinding:
        current = await self.topic_binding(topic)
        if current is None:
            raise FailedPrecondition(f"topic {shown(topic)} has no schema subject: configure one first")
        return await self.bind_topic(topic, current.subject, policy, payload_validation)

    async def _seen(self, name: TopicName, binding: TopicBinding) -> None:
        """Wait until this broker's watch shows the write, so that the next publish here obeys it."""
        expected = binding.to_json()

        def shown_here() -> bool:
            kv = self.bindings.get(binding_key(name))
            return kv is not None and kv.value == expected

        if self.bindings.ready:
            await self.bindings.wait_for(shown_here, 5.0)
