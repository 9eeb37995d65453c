"""Admin operations on namespaces (docs/admin.md): listing, policies, creation, replication, deletion."""

from __future__ import annotations

import logging
from typing import Any

import msgspec

from ister.broker.admin_base import AdminBase
from ister.core.replication_policy import ReplicationSetting, check_setting
from ister.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
)
from ister.ids import shown, validate_segment
from ister.metadata import keys
from ister.metadata import topic_catalog as catalog
from ister.metadata.records import (
    NamespacePolicy,
)

log = logging.getLogger(__name__)


class NamespaceAdmin(AdminBase):
    async def list_namespaces(self) -> list[str]:
        return keys.namespace_names(kv.key for kv in await self._list_all(keys.NAMESPACES_PREFIX))

    async def namespace_topics(self, ns: str) -> list[str]:
        await self._require_namespace(ns)
        return await self._namespace_topics(ns)

    async def namespace_policies(self, ns: str) -> dict[str, Any]:
        return await self._require_namespace(ns)

    async def create_namespace(self, ns: str) -> None:
        validate_segment(ns, "namespace")
        policies = self.broker.config.policies
        policy = {name: getattr(policies, name) for name in policies.__struct_fields__}
        if not await catalog.create_namespace(self.store, ns, policy):
            raise AlreadyExists(f"namespace {shown(ns)} already exists")
        log.info("admin: created namespace %s", ns)

    async def set_namespace_replication(self, ns: str, setting: ReplicationSetting) -> NamespacePolicy:
        """Set a namespace's replication factor and/or minimum in-sync set by compare-and-set, keeping its
        other policies (also fields Ister does not know); returns the policy as stored."""
        factor, min_insync = setting.replication_factor, setting.min_insync_replicas
        if factor is None and min_insync is None:
            raise InvalidArgument("nothing to set: give replication_factor, min_insync_replicas or both")
        check_setting(ReplicationSetting(factor), 1)  # the factor's range, before anything is read
        self._refuse_copies_standalone(setting)
        validate_segment(ns, "namespace")

        def change(value: dict[str, Any]) -> dict[str, Any]:
            old = NamespacePolicy.lenient(value)
            check_setting(setting, self._inherited_factor(old))
            new = msgspec.structs.replace(
                old,
                replication_factor=factor if factor is not None else old.replication_factor,
                min_insync_replicas=min_insync if min_insync is not None else old.min_insync_replicas,
            )
            new_factor = self._inherited_factor(new)
            if min_insync is None and (new.min_insync_replicas or 0) > new_factor:
                raise InvalidArgument(
                    f"namespace {shown(ns)} has min_insync_replicas {new.min_insync_replicas}, more than "
                    f"replication_factor {new_factor}; give min_insync_replicas too"
                )
            # Only the fields given: the other one stays as stored (absent stays absent, not null).
            if factor is not None:
                value["replication_factor"] = factor
            if min_insync is not None:
                value["min_insync_replicas"] = min_insync
            return value

        async with self._lock:  # against a concurrent delete here; other brokers: the compare-and-set
            new = NamespacePolicy.lenient(await catalog.update_namespace_policy(self.store, ns, change))
        log.info(
            "admin: namespace %s replication factor %s, min in-sync %s",
            ns,
            new.replication_factor,
            new.min_insync_replicas,
        )
        return new

    async def delete_namespace(self, ns: str) -> None:
        async with self._lock:
            await self._require_namespace(ns)
            topics = await self._namespace_topics(ns)
            if topics:
                listed = ", ".join(topics[:5]) + (", ..." if len(topics) > 5 else "")
                raise FailedPrecondition(
                    f"namespace {shown(ns)} still has {len(topics)} topic(s) ({listed}); delete them first"
                )
            await catalog.delete_namespace(self.store, ns)
        log.info("admin: deleted namespace %s", ns)
