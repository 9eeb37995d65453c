"""JSON Schema (drafts 4 to 2020-12, detected from `$schema`, 2020-12 when absent): jsonschema-rs compiles
the schema once into a validator, and its canonical form decides compatibility by containment: data
written under schema W can be read under schema R when R admits every value W admits.

That one rule covers what a hand-written diff would look for, with the real semantics: a property added
to an open object (`additionalProperties` absent) may already hold any value in old data, so adding it
is not backward compatible, while adding it to a closed object is; a new required property, a narrowed
type, a removed enum value or a tighter bound make old data invalid; the reverse changes are forward
incompatible. Containment the library cannot prove (UNKNOWN) counts as incompatible.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jsonschema_rs
import msgspec
from jsonschema_rs import canonical as jcanon

from ister.core.schema.model import ParsedSchema, sha256_fingerprint
from ister.core.schema.types import SchemaType
from ister.errors import InvalidArgument
from ister.ids import clip, shown

_json = msgspec.json.Decoder()


def _no_remote(uri: str) -> Any:
    raise ValueError(f"remote references are not allowed ({uri}): bundle the schema with its $defs")


class JsonSchema(ParsedSchema):
    def __init__(self, raw: str) -> None:
        self.type = SchemaType.JSON_SCHEMA
        self.raw = raw
        try:
            document = _json.decode(raw)
        except msgspec.DecodeError as exc:
            raise InvalidArgument(f"JSON Schema is not JSON: {clip(str(exc))}") from None
        if not isinstance(document, dict | bool):
            raise InvalidArgument("a JSON Schema is an object or a boolean")
        self.document = document
        try:
            self._validator = jsonschema_rs.validator_for(
                document, validate_formats=False, retriever=_no_remote
            )
            self.canonical_form = jsonschema_rs.canonicalize(document, retriever=_no_remote)
        except jsonschema_rs.ValidationError as exc:
            raise InvalidArgument(f"invalid JSON Schema: {clip(exc.message)}") from None
        except (jsonschema_rs.ReferencingError, jcanon.CanonicalizationError, ValueError) as exc:
            raise InvalidArgument(f"invalid JSON Schema: {clip(str(exc))}") from None
        except RecursionError:
            raise InvalidArgument("invalid JSON Schema: nested too deeply") from None
        self.canonical = jcanon.json.to_string(document)
        self.fingerprint = sha256_fingerprint(self.canonical)
        self.draft = document.get("$schema", "") if isinstance(document, dict) else ""

    def validate(self, payload: bytes) -> str | None:
        try:
            value = _json.decode(payload)
        except msgspec.DecodeError as exc:
            return f"payload is not JSON: {clip(str(exc))}"
        if self._validator.is_valid(value):
            return None
        for error in self._validator.iter_errors(value):
            return f"{clip(error.message)} at {'/'.join(map(str, error.instance_path)) or '(root)'}"
        return "payload does not match the JSON Schema"

    def first_invalid(self, payloads: Sequence[bytes], start: int = 0) -> tuple[int, str] | None:
        decode, is_valid = _json.decode, self._validator.is_valid
        for index in range(start, len(payloads)):
            payload = payloads[index]
            try:
                ok = is_valid(decode(payload))
            except msgspec.DecodeError:
                ok = False
            if not ok:
                return index, self.validate(payload) or "payload does not match the JSON Schema"
        return None

    def encode(self, value: Any) -> bytes:
        data = msgspec.json.encode(value)
        error = self.validate(data)
        if error is not None:
            raise InvalidArgument(error)
        return data

    def decode(self, payload: bytes) -> Any:
        return _json.decode(payload)


def json_can_read(reader: JsonSchema, writer: JsonSchema) -> list[str]:
    """Why a value valid under `writer` may be invalid under `reader` (empty: every one is valid)."""
    try:
        verdict = reader.canonical_form.covers(writer.canonical_form)
    except (jcanon.CanonicalizationError, ValueError) as exc:
        return [f"the schemas cannot be compared ({clip(str(exc))}); use the same $schema draft"]
    if verdict == jcanon.Containment.YES:
        return []
    reasons = _explain(reader.document, writer.document)
    if verdict == jcanon.Containment.UNKNOWN and not reasons:
        return ["cannot prove that the reader's schema admits every value of the writer's"]
    return reasons or ["the reader's schema rejects values the writer's schema admits"]


def _explain(reader: Any, writer: Any) -> list[str]:
    """Name the top-level differences behind a failed containment (best effort; the verdict is the
    library's)."""
    if not isinstance(reader, dict) or not isinstance(writer, dict):
        return []
    out: list[str] = []
    if reader.get("type") != writer.get("type") and writer.get("type") is not None:
        out.append(f"type {shown(writer.get('type'))} changed to {shown(reader.get('type'))}")
    r_props: dict[str, Any] = reader.get("properties") or {}
    w_props: dict[str, Any] = writer.get("properties") or {}
    r_req, w_req = set(reader.get("required") or ()), set(writer.get("required") or ())
    w_open = writer.get("additionalProperties", True) is not False
    for name in sorted(r_req - w_req):
        out.append(f"property {shown(name)} is required by the reader but optional or absent for the writer")
    for name in sorted(set(r_props) - set(w_props)):
        if w_open and r_props[name] is not True and r_props[name] != {}:
            out.append(
                f"property {shown(name)} added to an open object: the writer's data may hold any value"
            )
    if reader.get("additionalProperties", True) is False:
        for name in sorted(set(w_props) - set(r_props)):
            out.append(f"property {shown(name)} of the writer is not allowed by the reader (closed object)")
    for name in sorted(set(r_props) & set(w_props)):
        if isinstance(r_props[name], dict | bool) and isinstance(w_props[name], dict | bool):
            try:
                sub_r = jsonschema_rs.canonicalize(r_props[name], retriever=_no_remote)
                sub_w = jsonschema_rs.canonicalize(w_props[name], retriever=_no_remote)
            except Exception:  # a $ref into the root document: nothing finer to say
                continue
            if sub_r.covers(sub_w) != jcanon.Containment.YES:
                out.append(f"property {shown(name)} narrowed: the reader rejects some of the writer's values")
    if "enum" in writer and "enum" in reader:
        missing = [v for v in writer["enum"] if v not in reader["enum"]]
        if missing:
            out.append(f"enum values {shown(missing)} of the writer are not in the reader's enum")
    return out
