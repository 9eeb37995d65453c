"""Admin of enforced limits (docs/limits.md): a namespace's rates and counts (fields of its policy, by
compare-and-set, its other fields kept) and a topic's own rates (`/ister/rate-limits/{ns}/{topic}`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ister.broker.rate_limits import rates_in_effect
from ister.errors import InvalidArgument, NotFound
from ister.ids import TopicName, shown, validate_segment
from ister.limits import U64_MAX
from ister.metadata import keys
from ister.metadata import topic_catalog as catalog
from ister.metadata.records import NamespacePolicy, TopicRateLimits
from ister.metadata.store import MetadataStore

RATE_LIMITS = ("max_publish_rate", "max_publish_rate_bytes", "max_subscription_dispatch_rate")
COUNT_LIMITS = (
    "max_producers_per_topic",
    "max_subscriptions_per_topic",
    "max_consumers_per_topic",
    "max_consumers_per_subscription",
    "max_topics_per_namespace",
)
NAMESPACE_LIMITS = RATE_LIMITS + COUNT_LIMITS


class LimitsInEffect:
    def __init__(self, limits: dict[str, int], sources: dict[str, str]) -> None:
        self.limits = limits
        self.sources = sources


def _checked(given: dict[str, int], allowed: tuple[str, ...], what: str) -> None:
    for name, value in given.items():
        if name not in allowed:
            raise InvalidArgument(
                f"{shown(name)} is not a limit of {what}: expected one of {', '.join(allowed)}"
            )
        if not 0 <= value <= U64_MAX:
            raise InvalidArgument(f"{name} must be >= 0 (0 = unlimited)")


class LimitsAdmin:
    def __init__(
        self, store: MetadataStore, resolve: Callable[[str], Awaitable[tuple[TopicName, list[TopicName]]]]
    ) -> None:
        self.store = store
        self._resolve = resolve  # (name, its topics: itself or its partitions), NotFound when neither

    async def set_namespace(self, ns: str, given: dict[str, int]) -> LimitsInEffect:
        validate_segment(ns, "namespace")
        if not given:
            raise InvalidArgument("nothing to set: give at least one limit")
        _checked(given, NAMESPACE_LIMITS, "a namespace")

        def change(value: dict[str, object]) -> dict[str, object]:
            value.update(given)
            return value

        await catalog.update_namespace_policy(self.store, ns, change)
        return await self.get_namespace(ns)

    async def get_namespace(self, ns: str) -> LimitsInEffect:
        validate_segment(ns, "namespace")
        policy = await self._policy(ns)
        return LimitsInEffect({n: int(getattr(policy, n)) for n in NAMESPACE_LIMITS}, {})

    async def _policy(self, ns: str) -> NamespacePolicy:
        kv = await self.store.get(keys.namespace_policy(ns))
        if kv is None:
            raise NotFound(f"namespace {shown(ns)} does not exist")
        return NamespacePolicy.lenient(kv.value)

    async def set_topic(self, raw: str, given: dict[str, int], clear: bool) -> LimitsInEffect:
        """Every partition of a partitioned topic gets the same rates."""
        if clear and given:
            raise InvalidArgument("give either limits or clear, not both")
        if not clear and not given:
            raise InvalidArgument("nothing to set: give at least one rate, or clear")
        _checked(given, RATE_LIMITS, "a topic (counts are namespace policies)")
        _, targets = await self._resolve(raw)
        for name in targets:
            key = keys.topic_rate_limits(name)
            if clear:
                await self.store.delete(key)
                continue
            kv = await self.store.get(key)
            old = (TopicRateLimits.parse(kv.value) if kv is not None else None) or TopicRateLimits()
            fields = old.to_json() | given
            await self.store.put(key, TopicRateLimits(**fields).to_json())
        return await self.get_topic(raw)

    async def get_topic(self, raw: str) -> LimitsInEffect:
        _, targets = await self._resolve(raw)
        name = targets[0]
        kv = await self.store.get(keys.topic_rate_limits(name))
        own = TopicRateLimits.parse(kv.value) if kv is not None else None
        rates = rates_in_effect(await self._policy(name.namespace), own)
        return LimitsInEffect(
            {
                "max_publish_rate": rates.publish.messages,
                "max_publish_rate_bytes": rates.publish.bytes,
                "max_subscription_dispatch_rate": rates.dispatch,
            },
            {
                "max_publish_rate": rates.messages_source,
                "max_publish_rate_bytes": rates.bytes_source,
                "max_subscription_dispatch_rate": rates.dispatch_source,
            },
        )
