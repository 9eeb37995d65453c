"""The schema registry from the Ister client: register, resolve, check, and schemas that decode payloads.

Calls go to the client's service URL (`danube_schema.SchemaRegistry`, served by every broker). A resolved
`SchemaVersion` carries the parsed schema (`ister.core.schema`), so producers can validate and consumers
can decode without another round trip; parsed versions are cached per (id, version).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ister import errors
from ister.client.errors import to_ister_error
from ister.core.schema import ParsedSchema, SchemaType, parse, parse_schema_type
from ister.wire.gen import SchemaRegistry_pb2 as pb
from ister.wire.gen import SchemaRegistry_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from ister.client.connection import ClientConnection

CALL_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class SchemaVersion:
    schema_id: int
    subject: str
    version: int
    schema: ParsedSchema
    fingerprint: str
    compatibility_mode: str

    def decode(self, payload: bytes) -> Any:
        return self.schema.decode(payload)


@dataclass(frozen=True, slots=True)
class Registered:
    schema_id: int
    version: int
    is_new_version: bool
    fingerprint: str


def schema_of_envelope(schema_type: str, definition: bytes) -> ParsedSchema:
    """Parse GetSchema's `schema_definition` (Danube's JSON envelope of the stored definition)."""
    kind = parse_schema_type(schema_type)
    if kind.is_primitive:
        return parse(kind, "")
    try:
        body = json.loads(definition)[kind.envelope_tag]
    except (ValueError, KeyError, TypeError):
        raise errors.InvalidArgument(
            f"unreadable {schema_type} schema definition from the registry"
        ) from None
    if kind is SchemaType.PROTOBUF:
        from ister.schema.protoc import compile_proto_sync

        text = str(body["raw_proto"])
        return parse(kind, text, compile_proto_sync(text))
    return parse(kind, str(body["raw_schema"]))


class SchemaRegistry:
    def __init__(self, client: ClientConnection) -> None:
        self._client = client
        self._cache: dict[tuple[int, int], SchemaVersion] = {}

    def _stub(self) -> Any:
        return pb_grpc.SchemaRegistryStub(self._client._channel(self._client.url))

    async def _call(self, method: str, request: Any) -> Any:
        try:
            return await getattr(self._stub(), method)(request, timeout=CALL_TIMEOUT_SECONDS)
        except Exception as exc:
            raise to_ister_error(exc) from None

    async def register(
        self,
        subject: str,
        schema_type: str,
        definition: bytes | str,
        *,
        description: str = "",
        created_by: str = "ister-client",
        tags: list[str] | None = None,
    ) -> Registered:
        data = definition.encode() if isinstance(definition, str) else definition
        r = await self._call(
            "RegisterSchema",
            pb.RegisterSchemaRequest(
                subject=subject,
                schema_type=schema_type,
                schema_definition=data,
                description=description,
                created_by=created_by,
                tags=tags or [],
            ),
        )
        return Registered(r.schema_id, r.version, r.is_new_version, r.fingerprint)

    def _version(self, r: Any) -> SchemaVersion:
        hit = self._cache.get((r.schema_id, r.version))
        if hit is not None and hit.fingerprint == r.fingerprint:
            return hit
        found = SchemaVersion(
            schema_id=r.schema_id,
            subject=r.subject,
            version=r.version,
            schema=schema_of_envelope(r.schema_type, r.schema_definition),
            fingerprint=r.fingerprint,
            compatibility_mode=r.compatibility_mode,
        )
        if len(self._cache) > 1024:
            self._cache.clear()
        self._cache[(r.schema_id, r.version)] = found
        return found

    async def latest(self, subject: str) -> SchemaVersion:
        return self._version(await self._call("GetLatestSchema", pb.GetLatestSchemaRequest(subject=subject)))

    async def get(self, schema_id: int, version: int | None = None) -> SchemaVersion:
        if version is not None and (schema_id, version) in self._cache:
            return self._cache[(schema_id, version)]
        request = pb.GetSchemaRequest(schema_id=schema_id)
        if version is not None:
            request.version = version
        return self._version(await self._call("GetSchema", request))

    async def resolve(
        self, subject: str, *, version: int | None = None, min_version: int | None = None
    ) -> SchemaVersion:
        """The version a producer stamps: the latest, a pinned `version`, or the latest if >= `min_version`
        (as danube-client's producers resolve theirs)."""
        latest = await self.latest(subject)
        if version is not None:
            if version > latest.version:
                raise errors.NotFound(f"subject {subject} has no version {version} (latest {latest.version})")
            return latest if version == latest.version else await self.get(latest.schema_id, version)
        if min_version is not None and latest.version < min_version:
            raise errors.FailedPrecondition(
                f"subject {subject} is at version {latest.version}, below the minimum {min_version}"
            )
        return latest

    async def decode(self, message: Any) -> Any:
        """A received message's payload decoded by the schema version it is stamped with."""
        if message.schema_id is None:
            raise errors.InvalidArgument("the message carries no schema id")
        found = await self.get(message.schema_id, message.schema_version)
        return found.decode(message.payload)

    async def versions(self, subject: str) -> list[dict[str, Any]]:
        r = await self._call("ListVersions", pb.ListVersionsRequest(subject=subject))
        return [
            {
                "version": v.version,
                "schema_id": v.schema_id,
                "fingerprint": v.fingerprint,
                "created_at": v.created_at,
                "created_by": v.created_by,
                "description": v.description,
            }
            for v in r.versions
        ]

    async def check(
        self, subject: str, schema_type: str, definition: bytes | str, mode: str | None = None
    ) -> list[str]:
        data = definition.encode() if isinstance(definition, str) else definition
        request = pb.CheckCompatibilityRequest(
            subject=subject, schema_type=schema_type, new_schema_definition=data
        )
        if mode is not None:
            request.compatibility_mode = mode
        return list((await self._call("CheckCompatibility", request)).errors)

    async def set_mode(self, subject: str, mode: str) -> str:
        request = pb.SetCompatibilityModeRequest(subject=subject, compatibility_mode=mode)
        return str((await self._call("SetCompatibilityMode", request)).message)

    async def delete_version(self, subject: str, version: int) -> str:
        request = pb.DeleteSchemaVersionRequest(subject=subject, version=version)
        return str((await self._call("DeleteSchemaVersion", request)).message)

    async def configure_topic(
        self, topic: str, subject: str, policy: str = "enforce", payload_validation: bool = True
    ) -> str:
        request = pb.ConfigureTopicSchemaRequest(
            topic_name=topic,
            schema_subject=subject,
            validation_policy=policy,
            enable_payload_validation=payload_validation,
        )
        return str((await self._call("ConfigureTopicSchema", request)).message)

    async def update_topic_policy(self, topic: str, policy: str, payload_validation: bool = True) -> str:
        request = pb.UpdateTopicValidationPolicyRequest(
            topic_name=topic, validation_policy=policy, enable_payload_validation=payload_validation
        )
        return str((await self._call("UpdateTopicValidationPolicy", request)).message)

    async def topic_config(self, topic: str) -> dict[str, Any]:
        r = await self._call("GetTopicSchemaConfig", pb.GetTopicSchemaConfigRequest(topic_name=topic))
        return {
            "schema_subject": r.schema_subject,
            "validation_policy": r.validation_policy,
            "enable_payload_validation": r.enable_payload_validation,
            "schema_id": r.schema_id,
        }

    async def subjects(self) -> list[dict[str, Any]]:
        r = await self._call("ListSubjects", pb.ListSubjectsRequest())
        return [
            {
                "subject": s.subject,
                "schema_type": s.schema_type,
                "latest_version": s.latest_version,
                "compatibility_mode": s.compatibility_mode,
                "schema_id": s.schema_id,
            }
            for s in r.subjects
        ]
