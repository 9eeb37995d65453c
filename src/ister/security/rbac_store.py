"""Roles and bindings kept in the metadata store (Danube's layout, docs/metadata.md) and a local copy.

Keys: `/auth/roles/{role}`, `/auth/bindings/cluster/{id}`, `/auth/bindings/namespace/{ns}/{id}`,
`/auth/bindings/topic/{ns}/{topic}/{id}`, values as Danube writes them. Every broker loads them all at
start and reloads on any change under `/auth/` (a watch), so a grant or revoke made on one broker holds on
every broker within a watch round-trip; writes made here apply locally at once. Decisions are memoised
(bounded) until the next change: a repeated check is one dict lookup.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ister.errors import FailedPrecondition, IsterError, MetadataError, NotFound
from ister.metadata.store import MetadataStore, list_all
from ister.security.rbac import Binding, Policy, Resource, Role, check_binding, check_role
from ister.security.tokens import Principal
from ister.tasks import TaskSupervisor

log = logging.getLogger(__name__)

PREFIX = "/auth/"
ROLES = "/auth/roles/"
BINDINGS = "/auth/bindings/"
DECISION_CACHE_ENTRIES = 50_000
RELOAD_RETRY_SECONDS = 1.0


def binding_key(scope: str, resource_name: str, binding_id: str) -> str:
    if scope == "cluster":
        return f"{BINDINGS}cluster/{binding_id}"
    return f"{BINDINGS}{scope}/{resource_name.strip('/')}/{binding_id}"


def _role(value: Any) -> Role:
    return Role(
        str(value["name"]), tuple(str(p) for p in value.get("permissions", [])), bool(value.get("system"))
    )


def _binding(value: Any) -> Binding:
    return Binding(
        id=str(value["id"]),
        principal_type=str(value["principal_type"]),
        principal_name=str(value["principal_name"]),
        role_names=tuple(str(r) for r in value.get("role_names", [])),
        scope=str(value["scope"]),
        resource_name=str(value.get("resource_name", "")),
    )


class RbacStore:
    def __init__(self, store: MetadataStore, superusers: list[str]) -> None:
        self.store = store
        self.policy = Policy(superusers=frozenset(superusers))
        self._decisions: dict[tuple[str, str, str, str, str], bool] = {}
        self._tasks = TaskSupervisor("rbac store")  # the watch

    # -- decisions ---------------------------------------------------------------------------------------
    def allows(self, principal: Principal, permission: str, resource: Resource) -> bool:
        key = (principal.type, principal.name, permission, resource.kind, resource.name)
        found = self._decisions.get(key)
        if found is None:
            found = self.policy.allows(principal, permission, resource)
            if len(self._decisions) >= DECISION_CACHE_ENTRIES:
                self._decisions.clear()
            self._decisions[key] = found
        return found

    def is_superuser(self, principal: Principal) -> bool:
        return principal.name in self.policy.superusers

    # -- loading -----------------------------------------------------------------------------------------
    async def start(self) -> None:
        await self.reload()
        self._tasks.spawn(self._watch(), "rbac-watch")

    async def close(self) -> None:
        await self._tasks.close()

    async def reload(self) -> None:
        roles: dict[str, Role] = {}
        bindings: list[Binding] = []
        for kv in await list_all(self.store, PREFIX):
            try:
                if kv.key.startswith(ROLES):
                    role = _role(kv.value)
                    roles[role.name] = role
                elif kv.key.startswith(BINDINGS):
                    bindings.append(_binding(kv.value))
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("ignoring malformed security record %s: %s", kv.key, exc)
        self.policy = Policy(superusers=self.policy.superusers, roles=roles, bindings=bindings)
        self._decisions = {}

    async def _watch(self) -> None:
        while True:
            try:
                async with self.store.watch(PREFIX) as watch:
                    await self.reload()  # whatever changed before the watch was in place
                    async for _event in watch:
                        await self.reload()
            except asyncio.CancelledError:
                raise
            except (MetadataError, IsterError, OSError) as exc:
                log.warning("security watch failed, retrying: %s", exc)
            await asyncio.sleep(RELOAD_RETRY_SECONDS)

    # -- SecurityAdmin ----------------------------------------------------------------------------------
    async def create_role(self, role: Role) -> None:
        check_role(role)
        await self.store.put(f"{ROLES}{role.name}", role.to_json())
        await self.reload()

    def get_role(self, name: str) -> Role:
        role = self.policy.roles.get(name)
        if role is None:
            raise NotFound(f"role {name[:64]!r} does not exist")
        return role

    def list_roles(self) -> list[Role]:
        return sorted(self.policy.roles.values(), key=lambda r: r.name)

    async def delete_role(self, name: str) -> None:
        role = self.get_role(name)
        if role.system:
            raise FailedPrecondition(f"role {name!r} is a system role and cannot be deleted")
        await self.store.delete(f"{ROLES}{name}")
        await self.reload()

    async def create_binding(self, binding: Binding) -> None:
        check_binding(binding)
        await self.store.put(binding_key(binding.scope, binding.resource_name, binding.id), binding.to_json())
        await self.reload()

    def _find(self, scope: str, resource_name: str, binding_id: str) -> Binding:
        for b in self.policy.bindings:
            if (
                b.scope == scope
                and b.resource_name.strip("/") == resource_name.strip("/")
                and b.id == binding_id
            ):
                return b
        raise NotFound(f"binding {binding_id[:64]!r} ({scope} {resource_name[:128]!r}) does not exist")

    def get_binding(self, scope: str, resource_name: str, binding_id: str) -> Binding:
        return self._find(scope, resource_name, binding_id)

    def list_bindings(self, scope: str | None = None, resource_name: str | None = None) -> list[Binding]:
        out = [
            b
            for b in self.policy.bindings
            if (scope is None or b.scope == scope)
            and (resource_name is None or b.resource_name.strip("/") == resource_name.strip("/"))
        ]
        return sorted(out, key=lambda b: (b.scope, b.resource_name, b.id))

    async def delete_binding(self, scope: str, resource_name: str, binding_id: str) -> None:
        b = self._find(scope, resource_name, binding_id)
        await self.store.delete(binding_key(b.scope, b.resource_name, b.id))
        await self.reload()
