"""Admin operations on subscriptions (docs/admin.md): unsubscribe, failure policies, dispatch settings."""

from __future__ import annotations

import logging

from ister.broker.admin_base import AdminBase
from ister.broker.admin_values import (
    SubscriptionPolicy,
    check_dispatch_settings,
)
from ister.broker.topic import RELIABLE
from ister.core.dispatch import FailurePolicy
from ister.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
)
from ister.ids import TopicName, shown, validate_client_name
from ister.metadata import keys
from ister.metadata import topic_catalog as catalog
from ister.metadata.records import (
    DispatchConfigRecord,
    SubscriptionRecord,
)
from ister.metadata.store import KeyValue

log = logging.getLogger(__name__)


class SubscriptionAdmin(AdminBase):
    async def _require_subscription(self, name: TopicName, sub: str) -> KeyValue | None:
        validate_client_name(sub, "subscription name")
        record = await self.store.get(keys.subscription(name, sub))
        loaded = self.broker.topics.get(name.full)
        if record is None and (loaded is None or sub not in loaded.subscriptions):
            raise NotFound(f"subscription {shown(sub)} does not exist on {name}")
        return record

    async def unsubscribe(self, raw: str, sub: str) -> None:
        """Remove a subscription with its cursor and policies; refused while a consumer is connected."""
        name = await self._require_topic(raw)
        await self._require_subscription(name, sub)
        if name.full not in self.broker.topics:
            owner = await self.placement_admin.owner(name)
            if owner is not None and owner != self.broker_id:
                where = await self._admin_addr_of(owner)
                raise FailedPrecondition(
                    f"{name} is served by broker {owner}; send the request to its admin API ({where})"
                )
        loaded = self.broker.topics.get(name.full)
        if loaded is not None:
            async with loaded.lock:
                await self.broker.close_idle_subscription(loaded, sub)
                loaded.untrack_cursor(sub)
                await catalog.erase_subscription(self.store, name, sub)
        else:
            await catalog.erase_subscription(self.store, name, sub)
        log.info("admin: removed subscription %s of %s", sub, name)

    async def _require_reliable(self, name: TopicName, what: str) -> None:
        if await self._delivery_of(name) != RELIABLE:
            raise FailedPrecondition(f"{what} applies to Reliable topics only; {name} is NonReliable")

    async def set_failure_policy(self, raw: str, sub: str, policy: FailurePolicy) -> None:
        """Store a subscription's failure policy (read when the subscription opens; see docs/admin.md)."""
        name = await self._require_topic(raw)
        validate_client_name(sub, "subscription name")
        await self._require_reliable(name, "a failure policy")
        if policy.poison_policy == "DeadLetter" and not (policy.dead_letter_topic or "").strip():
            raise InvalidArgument("poison policy DeadLetter needs a dead_letter_topic")
        if policy.dead_letter_topic is not None:
            TopicName.parse(policy.dead_letter_topic)
        if policy.base_redelivery_delay_ms > policy.max_redelivery_delay_ms:
            raise InvalidArgument("base_redelivery_delay_ms must be <= max_redelivery_delay_ms")
        await self.store.put(keys.subscription_failure_policy(name, sub), policy.to_json())

    async def get_failure_policy(self, raw: str, sub: str) -> SubscriptionPolicy:
        name = await self._require_topic(raw)
        validate_client_name(sub, "subscription name")
        kv = await self.store.get(keys.subscription_failure_policy(name, sub))
        record = await self.store.get(keys.subscription(name, sub))
        if kv is None and record is None:
            await self._require_subscription(name, sub)
        policy = None
        if kv is not None and isinstance(kv.value, dict):
            try:
                policy = FailurePolicy.from_json(kv.value)
            except InvalidArgument as exc:
                log.warning("stored failure policy of %s/%s is invalid: %s", name, sub, exc)
        parsed = SubscriptionRecord.parse(record.value) if record is not None else None
        return SubscriptionPolicy(policy, parsed.subscription_type if parsed is not None else 0)

    async def set_dispatch_config(
        self,
        raw: str,
        sub: str,
        max_unacked: int | None = None,
        rebalance_delay: float | None = None,
        max_handoff: float | None = None,
    ) -> None:
        """Store a subscription's dispatch settings (a partitioned base name: on each partition); None keeps
        a setting as it is. Applied at once to the subscription when it is open here."""
        check_dispatch_settings(max_unacked, rebalance_delay, max_handoff)
        _, targets = await self._resolve(raw)
        validate_client_name(sub, "subscription name")
        for name in targets:
            await self._require_reliable(name, "a dispatch config")
        for name in targets:
            key = keys.subscription_dispatch_config(name, sub)
            kv = await self.store.get(key)
            old = (DispatchConfigRecord.parse(kv.value) if kv is not None else None) or DispatchConfigRecord()
            new = DispatchConfigRecord(
                max_unacked_messages=max_unacked if max_unacked is not None else old.max_unacked_messages,
                rebalance_delay_seconds=rebalance_delay
                if rebalance_delay is not None
                else old.rebalance_delay_seconds,
                max_handoff_seconds=max_handoff if max_handoff is not None else old.max_handoff_seconds,
            )
            await self.store.put(key, new.to_json())
            loaded = self.broker.topics.get(name.full)
            open_sub = loaded.subscriptions.get(sub) if loaded is not None else None
            if open_sub is not None and max_unacked is not None:
                open_sub.set_window(max_unacked)
            part = name.partition
            if part is not None:
                groups = self.broker.consumer_refs.partition_groups
                groups.configure(f"/{name.namespace}/{part[0]}", sub, new)

    async def get_dispatch_config(self, raw: str, sub: str) -> DispatchConfigRecord | None:
        name = await self._require_topic(raw)
        validate_client_name(sub, "subscription name")
        kv = await self.store.get(keys.subscription_dispatch_config(name, sub))
        if kv is None:
            await self._require_subscription(name, sub)
            return None
        return DispatchConfigRecord.parse(kv.value)
