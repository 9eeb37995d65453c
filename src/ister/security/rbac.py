"""Role-based authorization, default-deny: roles (permission sets), bindings (principal → roles on a
cluster, namespace or topic pattern), and the decision for (principal, permission, resource).

Permission names are Danube's (`Lookup`, `Produce`, `Consume`, `Replicate`, `ManageNamespace`,
`ManageTopic`, `ManageSchema`, `ManageBroker`, `ManageCluster`) plus Ister's `ReadSchema` (schema reads;
`ManageSchema` implies it). A binding's resource may be a glob (`orders-*`, `/default/orders-*`); a topic
pattern matches the partitions of a partitioned topic too. Pure logic: the metadata-backed cache is
`ister.security.rbac_store`.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from typing import Any

from ister.errors import InvalidArgument
from ister.security.tokens import Principal

PERMISSIONS = (
    "Lookup",
    "Produce",
    "Consume",
    "Replicate",
    "ManageNamespace",
    "ManageTopic",
    "ManageSchema",
    "ManageBroker",
    "ManageCluster",
    "ReadSchema",
)
SCOPES = ("cluster", "namespace", "topic")
IMPLIED = {"ReadSchema": ("ManageSchema",)}  # a permission is also granted by these
ANY_TYPE = "*"  # a binding principal_type that matches every type
_PARTITION = re.compile(r"-part-\d+$")
_NAME = re.compile(r"^[A-Za-z0-9_.:@*?\-]{1,200}$")


@dataclass(frozen=True, slots=True)
class Resource:
    """What a call acts on: the cluster, a namespace, or a topic (`/ns/name`)."""

    kind: str  # cluster | namespace | topic
    name: str = ""

    @property
    def namespace(self) -> str:
        if self.kind == "namespace":
            return self.name
        if self.kind == "topic":
            return self.name.strip("/").split("/", 1)[0]
        return ""

    def __str__(self) -> str:
        return self.kind if self.kind == "cluster" else f"{self.kind}:{self.name}"


CLUSTER = Resource("cluster")


def topic_resource(name: str) -> Resource:
    """A topic given as `/ns/t` or `ns/t` (a malformed name still makes one: the servicer refuses it)."""
    return Resource("topic", "/" + name.strip().lstrip("/"))


@dataclass(frozen=True, slots=True)
class Role:
    name: str
    permissions: tuple[str, ...]
    system: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "permissions": list(self.permissions), "system": self.system}


@dataclass(frozen=True, slots=True)
class Binding:
    id: str
    principal_type: str
    principal_name: str
    role_names: tuple[str, ...]
    scope: str
    resource_name: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "principal_type": self.principal_type,
            "principal_name": self.principal_name,
            "role_names": list(self.role_names),
            "scope": self.scope,
            "resource_name": self.resource_name,
        }

    def matches(self, principal: Principal) -> bool:
        return self.principal_name == principal.name and self.principal_type in (principal.type, ANY_TYPE)

    def covers(self, resource: Resource) -> bool:
        if self.scope == "cluster":
            return True
        if self.scope == "namespace":
            ns = resource.namespace
            return bool(ns) and fnmatch.fnmatchcase(ns, self.resource_name.strip("/"))
        if resource.kind != "topic":
            return False
        pattern = "/" + self.resource_name.lstrip("/")
        name = resource.name
        return fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(_PARTITION.sub("", name), pattern)


def check_role(role: Role) -> Role:
    if not role.name or not _NAME.match(role.name) or "*" in role.name or "?" in role.name:
        raise InvalidArgument(f"invalid role name {role.name[:64]!r}: letters, digits, _ . : @ - only")
    unknown = [p for p in role.permissions if p not in PERMISSIONS]
    if unknown:
        raise InvalidArgument(f"unknown permission {unknown[0][:64]!r}: one of {', '.join(PERMISSIONS)}")
    return role


def check_binding(b: Binding) -> Binding:
    for what, value in (("id", b.id), ("principal_name", b.principal_name)):
        if not value or not _NAME.match(value) or (what == "id" and ("*" in value or "?" in value)):
            raise InvalidArgument(f"invalid binding {what} {value[:64]!r}: letters, digits, _ . : @ - only")
    if b.principal_type not in ("service_account", "user", "broker_internal", ANY_TYPE):
        raise InvalidArgument("principal_type must be service_account, user, broker_internal or *")
    if not b.role_names:
        raise InvalidArgument("a binding needs at least one role")
    if b.scope not in SCOPES:
        raise InvalidArgument(f"scope must be one of {', '.join(SCOPES)}, got {b.scope[:32]!r}")
    if b.scope == "cluster" and b.resource_name:
        raise InvalidArgument("a cluster binding names no resource")
    if b.scope != "cluster":
        parts = b.resource_name.strip("/").split("/")
        want = 1 if b.scope == "namespace" else 2
        if len(parts) != want or not all(p and _NAME.match(p) for p in parts):
            shape = "NAMESPACE" if want == 1 else "/NAMESPACE/TOPIC"
            raise InvalidArgument(f"a {b.scope} binding needs --resource {shape} (globs * ? allowed)")
    return b


@dataclass(slots=True)
class Policy:
    """Roles and bindings in memory, with the decision for each (principal, permission, resource)."""

    superusers: frozenset[str] = frozenset()
    roles: dict[str, Role] = field(default_factory=dict)
    bindings: list[Binding] = field(default_factory=list)

    def allows(self, principal: Principal, permission: str, resource: Resource) -> bool:
        if principal.name in self.superusers:
            return True
        granting = (permission, *IMPLIED.get(permission, ()))
        for b in self.bindings:
            if not b.matches(principal) or not b.covers(resource):
                continue
            for role_name in b.role_names:
                role = self.roles.get(role_name)
                if role is not None and any(p in role.permissions for p in granting):
                    return True
        return False
