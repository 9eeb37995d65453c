"""`ister admin security tokens|roles|bindings` (danube-admin's command names, docs/security.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from ister.cli.admin import DEFAULT_ADMIN_ADDR, AdminAddr, admin_app, call_admin
from ister.errors import IsterError
from ister.security.tokens import DEFAULT_ISSUER, mint, parse_ttl
from ister.wire.gen import DanubeAdmin_pb2 as pb
from ister.wire.gen import ister_v1_pb2 as ipb

security_app = typer.Typer(no_args_is_help=True, help="Security: tokens, API keys, roles, role bindings.")
tokens_app = typer.Typer(no_args_is_help=True, help="Mint JWTs (HS256).")
roles_app = typer.Typer(no_args_is_help=True, help="Roles: named permission sets.")
bindings_app = typer.Typer(no_args_is_help=True, help="Bindings: principal → roles on a scope.")
api_keys_app = typer.Typer(
    no_args_is_help=True, help="API keys: secrets bound to a principal, exchanged for short-lived tokens."
)
security_app.add_typer(tokens_app, name="tokens")
security_app.add_typer(api_keys_app, name="api-keys")
security_app.add_typer(roles_app, name="roles")
security_app.add_typer(bindings_app, name="bindings")
admin_app.add_typer(security_app, name="security")

ScopeOpt = Annotated[str, typer.Option("--scope", help="cluster, namespace or topic")]
# One name per meaning: --principal-type everywhere (bindings had it); --type stays as a hidden alias.
PrincipalTypeOpt = Annotated[str, typer.Option("--principal-type", help="service_account or user")]
TypeAliasOpt = Annotated[str | None, typer.Option("--type", hidden=True)]
ResourceOpt = Annotated[str, typer.Option("--resource", help="namespace, /ns/topic (globs allowed), or ''")]


@tokens_app.command("create")
def tokens_create(
    principal: Annotated[str, typer.Option("--principal", help="the principal name the token carries")],
    ttl: Annotated[str, typer.Option("--ttl", help="lifetime: 90s, 15m, 1h, 30d")] = "1h",
    secret_file: Annotated[
        Path | None,
        typer.Option(
            "--secret-file", help="the broker's HS256 secret: mint offline (else through the admin API)"
        ),
    ] = None,
    principal_type: PrincipalTypeOpt = "service_account",
    type_alias: TypeAliasOpt = None,
    issuer: Annotated[
        str | None, typer.Option("--issuer", help=f"offline only (default {DEFAULT_ISSUER})")
    ] = None,
    audience: Annotated[str | None, typer.Option("--audience", help="offline only")] = None,
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
) -> None:
    """Mint a token and print it as the last line: offline with --secret-file, else the broker mints it
    (IsterAdmin.CreateToken: permission ManageCluster, with the broker's secret, issuer and audience)."""
    principal_type = type_alias or principal_type
    try:
        seconds = parse_ttl(ttl)
    except IsterError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if secret_file is None:
        if issuer is not None or audience is not None:
            typer.echo(
                "error: --issuer and --audience need --secret-file (the broker signs with its own)", err=True
            )
            raise typer.Exit(2)
        request = ipb.CreateTokenRequest(
            principal_name=principal, principal_type=principal_type, ttl_seconds=seconds
        )
        resp = call_admin(admin_addr, "ister_admin", "CreateToken", request)
        typer.echo(f"# principal {resp.principal}, valid {seconds} s (minted by the broker)", err=True)
        typer.echo(resp.token)
        return
    try:
        secret = secret_file.read_bytes().strip()
        tok = mint(
            secret,
            principal,
            seconds,
            principal_type=principal_type,
            issuer=issuer or DEFAULT_ISSUER,
            audience=audience,
        )
    except OSError as exc:
        typer.echo(f"error: cannot read {secret_file}: {exc.strerror}", err=True)
        raise typer.Exit(1) from None
    except IsterError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"# principal {principal} ({principal_type}), valid {seconds} s", err=True)
    typer.echo(tok)


def _print(obj: Any) -> None:
    typer.echo(json.dumps(obj, indent=2))


def _role(r: Any) -> dict[str, Any]:
    return {"name": r.name, "permissions": list(r.permissions), "system": r.system}


def _binding(b: Any) -> dict[str, Any]:
    return {
        "id": b.id,
        "principal_type": b.principal_type,
        "principal_name": b.principal_name,
        "role_names": list(b.role_names),
        "scope": b.scope,
        "resource_name": b.resource_name,
    }


@roles_app.command("create")
def roles_create(
    name: str,
    permissions: Annotated[str, typer.Option("--permissions", help="comma list, e.g. Produce,Lookup")],
    admin_addr: AdminAddr = "127.0.0.1:50051",
) -> None:
    role = pb.RoleDefinition(name=name, permissions=[p.strip() for p in permissions.split(",") if p.strip()])
    call_admin(admin_addr, "security", "CreateRole", pb.CreateRoleRequest(role=role))
    typer.echo(f"role {name} created")


@roles_app.command("get")
def roles_get(name: str, admin_addr: AdminAddr = "127.0.0.1:50051") -> None:
    _print(_role(call_admin(admin_addr, "security", "GetRole", pb.GetRoleRequest(name=name)).role))


@roles_app.command("list")
def roles_list(admin_addr: AdminAddr = "127.0.0.1:50051") -> None:
    _print([_role(r) for r in call_admin(admin_addr, "security", "ListRoles", pb.Empty()).roles])


@roles_app.command("delete")
def roles_delete(name: str, admin_addr: AdminAddr = "127.0.0.1:50051") -> None:
    call_admin(admin_addr, "security", "DeleteRole", pb.DeleteRoleRequest(name=name))
    typer.echo(f"role {name} deleted")


@bindings_app.command("create")
def bindings_create(
    binding_id: Annotated[str, typer.Argument(metavar="ID")],
    principal_name: Annotated[str, typer.Option("--principal-name")],
    roles: Annotated[str, typer.Option("--roles", help="comma list of role names")],
    scope: ScopeOpt = "cluster",
    resource: ResourceOpt = "",
    principal_type: Annotated[str, typer.Option("--principal-type")] = "service_account",
    admin_addr: AdminAddr = "127.0.0.1:50051",
) -> None:
    b = pb.BindingDefinition(
        id=binding_id,
        principal_type=principal_type,
        principal_name=principal_name,
        role_names=[r.strip() for r in roles.split(",") if r.strip()],
        scope=scope,
        resource_name=resource,
    )
    call_admin(admin_addr, "security", "CreateBinding", pb.CreateBindingRequest(binding=b))
    typer.echo(f"binding {binding_id} created")


@bindings_app.command("get")
def bindings_get(
    binding_id: Annotated[str, typer.Argument(metavar="ID")],
    scope: ScopeOpt = "cluster",
    resource: ResourceOpt = "",
    admin_addr: AdminAddr = "127.0.0.1:50051",
) -> None:
    req = pb.GetBindingRequest(scope=scope, resource_name=resource, binding_id=binding_id)
    _print(_binding(call_admin(admin_addr, "security", "GetBinding", req).binding))


@bindings_app.command("list")
def bindings_list(
    scope: Annotated[str, typer.Option("--scope", help="only this scope (default: all)")] = "",
    resource: ResourceOpt = "",
    admin_addr: AdminAddr = "127.0.0.1:50051",
) -> None:
    if scope:
        resp = call_admin(
            admin_addr,
            "security",
            "ListBindings",
            pb.ListBindingsRequest(scope=scope, resource_name=resource),
        )
    else:
        resp = call_admin(admin_addr, "security", "ListAllBindings", pb.Empty())
    _print([_binding(b) for b in resp.bindings])


@bindings_app.command("delete")
def bindings_delete(
    binding_id: Annotated[str, typer.Argument(metavar="ID")],
    scope: ScopeOpt = "cluster",
    resource: ResourceOpt = "",
    admin_addr: AdminAddr = "127.0.0.1:50051",
) -> None:
    req = pb.DeleteBindingRequest(scope=scope, resource_name=resource, binding_id=binding_id)
    call_admin(admin_addr, "security", "DeleteBinding", req)
    typer.echo(f"binding {binding_id} deleted")


def _api_key(k: Any) -> dict[str, Any]:
    return {
        "id": k.id,
        "principal_type": k.principal_type,
        "principal_name": k.principal_name,
        "description": k.description,
        "created_at_ms": k.created_at_ms,
    }


@api_keys_app.command("create")
def api_keys_create(
    principal: Annotated[str, typer.Option("--principal", help="the principal the key stands for")],
    principal_type: PrincipalTypeOpt = "service_account",
    type_alias: TypeAliasOpt = None,
    description: Annotated[str, typer.Option("--description")] = "",
    admin_addr: AdminAddr = "127.0.0.1:50051",
) -> None:
    """Create a key and print it as the last line (shown once: the broker keeps only its hash)."""
    principal_type = type_alias or principal_type
    request = ipb.CreateApiKeyRequest(
        principal_name=principal, principal_type=principal_type, description=description
    )
    resp = call_admin(admin_addr, "ister_admin", "CreateApiKey", request)
    typer.echo(f"API key {resp.key.id} created for {resp.key.principal_type}:{resp.key.principal_name}")
    typer.echo("use it as ISTER_API_KEY (or Client(api_key=...)); it is not shown again:")
    typer.echo(resp.api_key)


@api_keys_app.command("list")
def api_keys_list(admin_addr: AdminAddr = "127.0.0.1:50051") -> None:
    """Every key (ids and principals; never the secrets)."""
    resp = call_admin(admin_addr, "ister_admin", "ListApiKeys", ipb.ListApiKeysRequest())
    _print([_api_key(k) for k in resp.keys])


@api_keys_app.command("revoke")
def api_keys_revoke(key_id: str, admin_addr: AdminAddr = "127.0.0.1:50051") -> None:
    """Revoke a key: no new tokens for it (tokens already exchanged last until they expire)."""
    call_admin(admin_addr, "ister_admin", "RevokeApiKey", ipb.RevokeApiKeyRequest(id=key_id))
    typer.echo(f"API key {key_id} revoked")
