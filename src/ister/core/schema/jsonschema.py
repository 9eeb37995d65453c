"""JSON Schema (drafts 4 to 2020-12, detected from `$schema`, 2020-12 when absent): jsonschema-rs compiles
the schema once into a validator, and its canonical form decides compatibility by containment: data
written under schema W can be read under schema R when R admits every value W admits.

What "every value W admits" means depends on the rules (`JsonRules`). Under STRICT (the open content
model) it is literal: an object without `additionalProperties: false` admits any other property with any
value, so a property added to an open object is not backward compatible. Under DANUBE (the default) a
writer's data holds only the properties its schema lists: the writer's schema is read closed (every object
that lists properties gets `additionalProperties: false`, at every depth) before the containment check, so
adding or removing an optional property is compatible, while a new required property, a narrowed type, a
removed enum value or a tighter bound still make old data invalid, in nested objects and array items too.
Containment the library cannot prove (UNKNOWN) counts as incompatible.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jsonschema_rs
import msgspec
from jsonschema_rs import canonical as jcanon

from ister.core.schema.model import ParsedSchema, sha256_fingerprint
from ister.core.schema.types import DEFAULT_JSON_RULES, JsonRules, SchemaType
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
        self._closed_form: Any = None

    @property
    def closed_form(self) -> Any:
        """The canonical form of the schema read closed (DANUBE rules' view of a writer), made once."""
        if self._closed_form is None:
            self._closed_form = jsonschema_rs.canonicalize(closed(self.document), retriever=_no_remote)
        return self._closed_form

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


# Keywords whose value is a schema, a list of schemas or a name -> schema map (values of enum, const,
# default and examples are data, never walked). allOf is left open: closing each part would make the
# parts refuse each other's properties.
_SUBSCHEMA = ("items", "additionalItems", "contains", "not", "if", "then", "else", "additionalProperties")
_SUBSCHEMA_LISTS = ("items", "prefixItems", "anyOf", "oneOf")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_OPENERS = ("additionalProperties", "patternProperties", "unevaluatedProperties", "allOf")


def closed(node: Any) -> Any:
    """The schema with every object that lists `properties` (and says nothing else about other
    properties) closed by `additionalProperties: false`, at every depth."""
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for keyword, value in node.items():
        if keyword in _SUBSCHEMA_MAPS and isinstance(value, dict):
            out[keyword] = {name: closed(sub) for name, sub in value.items()}
        elif keyword in _SUBSCHEMA_LISTS and isinstance(value, list):
            out[keyword] = [closed(sub) for sub in value]
        elif keyword in _SUBSCHEMA:
            out[keyword] = closed(value)
        else:
            out[keyword] = value
    if "properties" in out and not any(k in out for k in _OPENERS):
        out["additionalProperties"] = False
    return out


def json_can_read(reader: JsonSchema, writer: JsonSchema, rules: JsonRules = DEFAULT_JSON_RULES) -> list[str]:
    """Why a value written under `writer` may be invalid under `reader` (empty: every one is valid)."""
    try:
        written = writer.closed_form if rules is JsonRules.DANUBE else writer.canonical_form
        verdict = reader.canonical_form.covers(written)
    except (jcanon.CanonicalizationError, ValueError) as exc:
        return [f"the schemas cannot be compared ({clip(str(exc))}); use the same $schema draft"]
    except RecursionError:
        return ["the schemas are nested too deeply to compare"]
    if verdict == jcanon.Containment.YES:
        return []
    reasons = _explain(reader.document, writer.document, rules, "")
    if verdict == jcanon.Containment.UNKNOWN and not reasons:
        return ["cannot prove that the reader's schema admits every value of the writer's"]
    return reasons or ["the reader's schema rejects values the writer's schema admits"]


def _explain(reader: Any, writer: Any, rules: JsonRules, where: str) -> list[str]:
    """Name the differences behind a failed containment, through nested objects and array items (best
    effort; the verdict is the library's). `where` is the path so far (`address.`, `tags[].`)."""
    if not isinstance(reader, dict) or not isinstance(writer, dict):
        return []
    out: list[str] = []
    at = f"property {shown(where[:-1])}: " if where else ""
    if reader.get("type") != writer.get("type") and writer.get("type") is not None:
        out.append(f"{at}type {shown(writer.get('type'))} changed to {shown(reader.get('type'))}")
    r_props: dict[str, Any] = reader.get("properties") or {}
    w_props: dict[str, Any] = writer.get("properties") or {}
    r_req, w_req = set(reader.get("required") or ()), set(writer.get("required") or ())
    w_open = rules is JsonRules.STRICT and writer.get("additionalProperties", True) is not False
    for name in sorted(r_req - w_req):
        out.append(
            f"property {shown(where + name)} is required by the reader but optional or absent for the writer"
        )
    for name in sorted(set(r_props) - set(w_props)):
        if w_open and r_props[name] is not True and r_props[name] != {}:
            out.append(
                f"property {shown(where + name)} added to an open object: "
                "the writer's data may hold any value (strict JSON rules)"
            )
    if reader.get("additionalProperties", True) is False:
        for name in sorted(set(w_props) - set(r_props)):
            out.append(
                f"property {shown(where + name)} of the writer is not allowed by the reader (closed object)"
            )
    for name in sorted(set(r_props) & set(w_props)):
        nested = _explain(r_props[name], w_props[name], rules, f"{where}{name}.")
        if nested:
            out += nested
        elif _narrowed(r_props[name], w_props[name], rules):
            out.append(
                f"property {shown(where + name)} narrowed: the reader rejects some of the writer's values"
            )
    r_items, w_items = reader.get("items"), writer.get("items")
    if isinstance(r_items, dict) and isinstance(w_items, dict):
        out += _explain(r_items, w_items, rules, f"{where[:-1]}[]." if where else "[].")
    if "enum" in writer and "enum" in reader:
        missing = [v for v in writer["enum"] if v not in reader["enum"]]
        if missing:
            out.append(f"{at}enum values {shown(missing)} of the writer are not in the reader's enum")
    return out


def _narrowed(reader: Any, writer: Any, rules: JsonRules) -> bool:
    if not isinstance(reader, dict | bool) or not isinstance(writer, dict | bool):
        return False
    try:
        sub_r = jsonschema_rs.canonicalize(reader, retriever=_no_remote)
        sub_w = jsonschema_rs.canonicalize(
            closed(writer) if rules is JsonRules.DANUBE else writer, retriever=_no_remote
        )
    except Exception:  # a $ref into the root document: nothing finer to say
        return False
    return bool(sub_r.covers(sub_w) != jcanon.Containment.YES)
