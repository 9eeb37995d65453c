"""The schemas page: subjects, a subject's versions, a diff between two versions, its compatibility mode,
and a draft checked against the registry (SchemaRegistry.CheckCompatibility, which registers nothing)."""

from __future__ import annotations

import difflib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ister.console.pagekit import Render, rpc_error
from ister.console.source import CALL_TIMEOUT_SECONDS, AdminSource
from ister.wire.gen import SchemaRegistry_pb2 as spb

Handler = Callable[[Request], Awaitable[Response]]
MAX_DRAFT_BYTES = 1_000_000


def pretty(definition: bytes) -> str:
    """The schema's own text out of the registry's envelope (`{"Avro": {"raw_schema": ...}}`), JSON
    (Avro, JSON Schema) re-indented so a diff shows the changed fields; anything else as it is."""
    text = definition.decode("utf-8", "replace")
    try:
        body = json.loads(text)
    except ValueError:
        return text
    inner = next(iter(body.values()), None) if isinstance(body, dict) and len(body) == 1 else None
    if isinstance(inner, dict):
        raw = inner.get("raw_schema") or inner.get("raw_proto")
        if isinstance(raw, str):
            text = raw
    try:
        return json.dumps(json.loads(text), indent=2)
    except ValueError:
        return text


def diff(old: str, new: str, old_name: str, new_name: str) -> list[tuple[str, str]]:
    """Unified diff lines, each with its kind (add, del, hunk, same) for the page's colours."""
    out = []
    lines = difflib.unified_diff(old.splitlines(), new.splitlines(), old_name, new_name, lineterm="")
    for line in lines:
        kind = {"+": "add", "-": "del", "@": "hunk"}.get(line[:1], "same")
        out.append((kind if not line.startswith(("+++", "---")) else "hunk", line))
    return out


@dataclass
class Draft:
    text: str = ""
    answer: Any = None  # CheckCompatibilityResponse
    error: str = ""


def _version(raw: str, default: int) -> int:
    if raw == "":
        return default
    if not raw.isascii() or not raw.isdigit():
        raise ValueError(f"a version is a number, got {raw[:40]!r}")
    return int(raw)


def _subjects(source: AdminSource, render: Render) -> Handler:
    async def subjects(request: Request) -> Response:
        try:
            listed = await source.schemas.ListSubjects(
                spb.ListSubjectsRequest(), timeout=CALL_TIMEOUT_SECONDS
            )
        except grpc.RpcError as exc:
            return rpc_error(render, exc, "schemas", "schema subjects")
        return render(
            "schemas.html", subjects=sorted(listed.subjects, key=lambda s: s.subject), nav="schemas"
        )

    return subjects


def _subject(source: AdminSource, render: Render) -> Handler:
    async def subject(request: Request) -> Response:
        name = request.path_params["subject"]
        reg = source.schemas
        draft = Draft()
        try:
            latest = await reg.GetLatestSchema(
                spb.GetLatestSchemaRequest(subject=name), timeout=CALL_TIMEOUT_SECONDS
            )
            versions = await reg.ListVersions(
                spb.ListVersionsRequest(subject=name), timeout=CALL_TIMEOUT_SECONDS
            )
            numbers = sorted(v.version for v in versions.versions)
            q = request.query_params
            try:
                new = _version(q.get("b", ""), numbers[-1])
                old = _version(q.get("a", ""), numbers[-2] if len(numbers) > 1 else numbers[-1])
            except ValueError as exc:
                return render("error.html", 400, message=str(exc), nav="schemas")
            if old not in numbers or new not in numbers:
                return render("error.html", 404, message=f"{name} has versions {numbers}", nav="schemas")

            async def text(v: int) -> str:
                got = await reg.GetSchema(
                    spb.GetSchemaRequest(schema_id=latest.schema_id, version=v), timeout=CALL_TIMEOUT_SECONDS
                )
                return pretty(got.schema_definition)

            old_text, new_text = await text(old), await text(new)
            if request.method == "POST":
                form = await request.form()
                draft.text = str(form.get("draft", ""))
                if not draft.text.strip() or len(draft.text.encode()) > MAX_DRAFT_BYTES:
                    draft.error = "paste a draft schema (at most 1 MB)"
                else:
                    check = spb.CheckCompatibilityRequest(
                        subject=name,
                        new_schema_definition=draft.text.encode(),
                        schema_type=latest.schema_type,
                    )
                    try:
                        draft.answer = await reg.CheckCompatibility(check, timeout=CALL_TIMEOUT_SECONDS)
                    except grpc.RpcError as exc:
                        if exc.code() != grpc.StatusCode.INVALID_ARGUMENT:
                            raise
                        draft.error = f"{exc.details()} ({exc.code().name})"
        except grpc.RpcError as exc:
            return rpc_error(render, exc, "schemas", f"schema subject {name}")
        return render(
            "schema.html",
            status=400 if draft.error else 200,
            name=name,
            latest=latest,
            versions=sorted(versions.versions, key=lambda v: v.version),
            old=old,
            new=new,
            new_text=new_text,
            lines=diff(old_text, new_text, f"v{old}", f"v{new}"),
            draft=draft,
            nav="schemas",
        )

    return subject


def routes(source: AdminSource, render: Render) -> list[Route]:
    return [
        Route("/schemas", _subjects(source, render)),
        Route("/schemas/{subject:path}", _subject(source, render), methods=["GET", "POST"]),
    ]
