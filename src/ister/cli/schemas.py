"""`ister admin schemas ...`: the schema registry (`danube_schema.SchemaRegistry`, served on the admin port
as on the client port). Same conventions as `ister admin`: `--admin-addr`, `--output table|json`,
`error: <message>` and exit 1 on failure. Documented in docs/schema-registry.md."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import grpc
import typer

from ister.cli.admin import (
    CALL_TIMEOUT_SECONDS,
    DEFAULT_ADMIN_ADDR,
    AdminAddr,
    Output,
    OutputOpt,
    admin_app,
    admin_channel,
    describe_rpc_error,
    emit_done,
    emit_fields,
    emit_json,
    emit_table,
    fail,
    target_of,
)
from ister.core.schema import JsonRules
from ister.wire.gen import SchemaRegistry_pb2 as pb
from ister.wire.gen import SchemaRegistry_pb2_grpc as pb_grpc

schemas_app = typer.Typer(
    no_args_is_help=True, help="Schema registry: register, get, versions, check, mode, delete, list."
)
admin_app.add_typer(schemas_app, name="schemas")

SubjectArg = Annotated[str, typer.Argument(help="schema subject")]
JsonRulesOpt = Annotated[
    JsonRules | None,
    typer.Option(
        "--json-rules", help="JSON Schema rules: danube (optional properties may come and go) or strict"
    ),
]
TYPES_BY_SUFFIX = {".avsc": "avro", ".avro": "avro", ".json": "json_schema", ".proto": "protobuf"}


def schema_type_of(path: Path, given: str | None) -> str:
    if given:
        return given
    found = TYPES_BY_SUFFIX.get(path.suffix.lower())
    if found is None:
        fail(f"cannot tell the schema type of {path.name}: pass --schema-type avro|json_schema|protobuf")
    return found


def read_definition(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        fail(f"cannot read {path}: {exc.strerror}")


def rpc(addr: str, method: str, request: Any) -> Any:
    target = target_of(addr)
    channel = admin_channel(addr, target)
    try:
        return getattr(pb_grpc.SchemaRegistryStub(channel), method)(request, timeout=CALL_TIMEOUT_SECONDS)
    except grpc.RpcError as exc:
        fail(describe_rpc_error(exc, target))
    finally:
        channel.close()


def _version_json(r: Any) -> dict[str, Any]:
    definition = json.loads(r.schema_definition) if r.schema_definition else None
    return {
        "subject": r.subject,
        "schema_id": str(r.schema_id),
        "version": r.version,
        "schema_type": r.schema_type,
        "fingerprint": r.fingerprint,
        "compatibility_mode": r.compatibility_mode,
        "created_at": r.created_at,
        "created_by": r.created_by,
        "description": r.description,
        "schema_definition": definition,
    }


@schemas_app.command("register")
def schemas_register(
    subject: SubjectArg,
    file: Annotated[Path, typer.Option("--file", "-f", help=".avsc, .json or .proto definition")],
    schema_type: Annotated[
        str | None, typer.Option("--schema-type", "-t", help="avro|json_schema|protobuf (default: by suffix)")
    ] = None,
    description: Annotated[str, typer.Option("--description")] = "",
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> None:
    """Register a schema (a new version of the subject if it is compatible; the same one is idempotent)."""
    kind = schema_type_of(file, schema_type)
    request = pb.RegisterSchemaRequest(
        subject=subject,
        schema_type=kind,
        schema_definition=read_definition(file),
        description=description,
        created_by="ister-cli",
    )
    r = rpc(admin_addr, "RegisterSchema", request)
    what = "registered" if r.is_new_version else "already registered as"
    emit_done(
        output,
        f"{what} {subject} version {r.version} (schema id {r.schema_id}, {r.fingerprint})",
        subject=subject,
        schema_id=str(r.schema_id),
        version=r.version,
        is_new_version=r.is_new_version,
        fingerprint=r.fingerprint,
    )


@schemas_app.command("get")
def schemas_get(
    subject: SubjectArg,
    version: Annotated[int | None, typer.Option("--version", "-v", min=1)] = None,
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> None:
    """Show the latest version of a subject, or --version N."""
    r = rpc(admin_addr, "GetLatestSchema", pb.GetLatestSchemaRequest(subject=subject))
    if version is not None and version != r.version:
        r = rpc(admin_addr, "GetSchema", pb.GetSchemaRequest(schema_id=r.schema_id, version=version))
    found = _version_json(r)
    if output == Output.json:
        emit_json(found)
        return
    body = found["schema_definition"]
    tag = next(iter(body)) if isinstance(body, dict) else None
    text = body[tag].get("raw_schema") or body[tag].get("raw_proto") if tag else ""
    emit_fields([(k, str(v)) for k, v in found.items() if k != "schema_definition"])
    typer.echo(text)


@schemas_app.command("versions")
def schemas_versions(
    subject: SubjectArg, admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR, output: OutputOpt = Output.table
) -> None:
    """List a subject's versions."""
    r = rpc(admin_addr, "ListVersions", pb.ListVersionsRequest(subject=subject))
    rows = [
        {
            "version": v.version,
            "schema_id": str(v.schema_id),
            "fingerprint": v.fingerprint,
            "created_at": v.created_at,
            "created_by": v.created_by,
        }
        for v in r.versions
    ]
    if output == Output.json:
        emit_json(rows)
    else:
        emit_table(
            ["VERSION", "SCHEMA ID", "FINGERPRINT", "CREATED BY"],
            [
                [str(x["version"]), str(x["schema_id"]), str(x["fingerprint"]), str(x["created_by"])]
                for x in rows
            ],
        )


@schemas_app.command("check")
def schemas_check(
    subject: SubjectArg,
    file: Annotated[Path, typer.Option("--file", "-f")],
    schema_type: Annotated[str | None, typer.Option("--schema-type", "-t")] = None,
    mode: Annotated[
        str | None, typer.Option("--mode", help="check under this mode instead of the subject's")
    ] = None,
    json_rules: JsonRulesOpt = None,
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> None:
    """Would this definition be accepted as the subject's next version? Exit 1 when it would not."""
    request = pb.CheckCompatibilityRequest(
        subject=subject,
        schema_type=schema_type_of(file, schema_type),
        new_schema_definition=read_definition(file),
    )
    if json_rules and not mode:
        raise typer.BadParameter("--json-rules needs --mode (the mode to check under)")
    if mode:
        request.compatibility_mode = f"{mode}:{json_rules.value}" if json_rules else mode
    r = rpc(admin_addr, "CheckCompatibility", request)
    if output == Output.json:
        emit_json({"is_compatible": r.is_compatible, "errors": list(r.errors)})
    elif r.is_compatible:
        typer.echo(f"compatible with {subject}")
    else:
        typer.echo(f"incompatible with {subject}:")
        for e in r.errors:
            typer.echo(f"  - {e}")
    if not r.is_compatible:
        raise typer.Exit(1)


@schemas_app.command("mode")
def schemas_mode(
    subject: SubjectArg,
    mode: Annotated[str, typer.Argument(help="none|backward|forward|full (+ _transitive)")],
    json_rules: JsonRulesOpt = None,
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> None:
    """Set a subject's compatibility mode (and, for JSON Schema, its rules: danube or strict)."""
    wire = f"{mode}:{json_rules.value}" if json_rules else mode
    r = rpc(
        admin_addr,
        "SetCompatibilityMode",
        pb.SetCompatibilityModeRequest(subject=subject, compatibility_mode=wire),
    )
    extra = {"json_rules": json_rules.value} if json_rules else {}
    emit_done(output, r.message, subject=subject, compatibility_mode=mode.lower(), **extra)


@schemas_app.command("delete")
def schemas_delete(
    subject: SubjectArg,
    version: Annotated[int, typer.Option("--version", "-v", min=1)],
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> None:
    """Delete one version (refused while topics use the subject)."""
    r = rpc(
        admin_addr, "DeleteSchemaVersion", pb.DeleteSchemaVersionRequest(subject=subject, version=version)
    )
    emit_done(output, r.message, subject=subject, version=version)


@schemas_app.command("list")
def schemas_list(admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR, output: OutputOpt = Output.table) -> None:
    """List subjects."""
    r = rpc(admin_addr, "ListSubjects", pb.ListSubjectsRequest())
    rows = [
        {
            "subject": s.subject,
            "schema_type": s.schema_type,
            "latest_version": s.latest_version,
            "compatibility_mode": s.compatibility_mode,
            "schema_id": str(s.schema_id),
        }
        for s in r.subjects
    ]
    if output == Output.json:
        emit_json(rows)
    else:
        emit_table(
            ["SUBJECT", "TYPE", "LATEST", "MODE", "ID"],
            [
                [
                    x["subject"],
                    x["schema_type"],
                    str(x["latest_version"]),
                    x["compatibility_mode"],
                    str(x["schema_id"]),
                ]
                for x in rows
            ],
        )


def set_topic_policy(addr: str, topic: str, policy: str, payload_validation: bool) -> None:
    """After `ister admin topics create --schema-subject`: the topic's validation policy."""
    request = pb.UpdateTopicValidationPolicyRequest(
        topic_name=topic, validation_policy=policy, enable_payload_validation=payload_validation
    )
    rpc(addr, "UpdateTopicValidationPolicy", request)
