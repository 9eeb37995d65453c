"""Servicer of `danube_schema.SchemaRegistry` on the client port (and the admin port, as Danube).

Every broker answers every call: reads go to the metadata store (versions are cached once parsed), writes
are compare-and-set transactions (`ister.schema.registry`). Differences from Danube, deliberately:
errors carry their own status (INVALID_ARGUMENT for an unparsable definition or unknown mode,
FAILED_PRECONDITION for an incompatible evolution or a version in use, NOT_FOUND for a missing subject,
id or version) instead of INTERNAL; the topic calls work on any broker, not only the topic's owner;
deleting a version removes it from the subject's metadata too.
"""

from __future__ import annotations

import json
from typing import Any

from ister.broker.service import BrokerService
from ister.core.schema import parse_policy
from ister.errors import InvalidArgument, NotFound
from ister.ids import TopicName
from ister.schema.records import VersionView
from ister.schema.registry import SchemaRegistry
from ister.server.errors import unary
from ister.server.handlers import add_service
from ister.wire.gen import SchemaRegistry_pb2 as pb
from ister.wire.gen import SchemaRegistry_pb2_grpc as pb_grpc

Ctx = Any  # grpc.aio.ServicerContext (untyped library)


def _response(view: VersionView) -> pb.GetSchemaResponse:
    return pb.GetSchemaResponse(
        schema_id=view.schema_id,
        version=view.version,
        subject=view.subject,
        schema_type=view.schema.type.value,
        schema_definition=json.dumps(view.schema.envelope(), separators=(",", ":")).encode(),
        description=view.description,
        created_at=view.created_at,
        created_by=view.created_by,
        tags=view.tags,
        fingerprint=view.schema.fingerprint,
        compatibility_mode=view.compatibility_mode.value,
    )


def _version(value: int) -> int:
    if value <= 0:
        raise InvalidArgument("schema versions count from 1")
    return value


class SchemaRegistryServicer(pb_grpc.SchemaRegistryServicer):  # type: ignore[misc]
    def __init__(self, registry: SchemaRegistry) -> None:
        self.registry = registry

    @unary
    async def RegisterSchema(self, request: pb.RegisterSchemaRequest, context: Ctx) -> Any:
        done = await self.registry.register(
            request.subject,
            request.schema_type,
            request.schema_definition,
            description=request.description,
            created_by=request.created_by,
            tags=list(request.tags),
        )
        return pb.RegisterSchemaResponse(
            schema_id=done.schema_id,
            version=done.version,
            is_new_version=done.is_new_version,
            fingerprint=done.fingerprint,
        )

    @unary
    async def GetSchema(self, request: pb.GetSchemaRequest, context: Ctx) -> Any:
        version = _version(request.version) if request.HasField("version") else None
        view = await self.registry.get(request.schema_id, version)
        return _response(view)

    @unary
    async def GetLatestSchema(self, request: pb.GetLatestSchemaRequest, context: Ctx) -> Any:
        return _response(await self.registry.latest(request.subject))

    @unary
    async def ListVersions(self, request: pb.ListVersionsRequest, context: Ctx) -> Any:
        schema_id, versions = await self.registry.list_versions(request.subject)
        return pb.ListVersionsResponse(
            versions=[
                pb.SchemaVersionInfo(
                    version=int(v.get("version", 0)),
                    created_at=int(v.get("created_at") or 0),
                    created_by=str(v.get("created_by") or ""),
                    description=str(v.get("description") or ""),
                    fingerprint=str(v.get("fingerprint") or ""),
                    schema_id=schema_id,
                )
                for v in versions
            ]
        )

    @unary
    async def CheckCompatibility(self, request: pb.CheckCompatibilityRequest, context: Ctx) -> Any:
        mode = request.compatibility_mode if request.HasField("compatibility_mode") else None
        errors = await self.registry.check_compatibility(
            request.subject, request.schema_type, request.new_schema_definition, mode
        )
        return pb.CheckCompatibilityResponse(is_compatible=not errors, errors=errors)

    @unary
    async def DeleteSchemaVersion(self, request: pb.DeleteSchemaVersionRequest, context: Ctx) -> Any:
        await self.registry.delete_version(request.subject, _version(request.version))
        return pb.DeleteSchemaVersionResponse(
            success=True, message=f"Deleted version {request.version} for subject {request.subject}"
        )

    @unary
    async def SetCompatibilityMode(self, request: pb.SetCompatibilityModeRequest, context: Ctx) -> Any:
        mode = await self.registry.set_mode(request.subject, request.compatibility_mode)
        return pb.SetCompatibilityModeResponse(
            success=True, message=f"Compatibility mode of {request.subject} set to {mode.value}"
        )

    @unary
    async def ConfigureTopicSchema(self, request: pb.ConfigureTopicSchemaRequest, context: Ctx) -> Any:
        policy = parse_policy(request.validation_policy or "none")
        binding = await self.registry.bind_topic(
            request.topic_name, request.schema_subject, policy, request.enable_payload_validation
        )
        return pb.ConfigureTopicSchemaResponse(
            success=True,
            message=f"Topic {request.topic_name} uses subject {binding.subject} ({binding.policy.value})",
        )

    @unary
    async def UpdateTopicValidationPolicy(
        self, request: pb.UpdateTopicValidationPolicyRequest, context: Ctx
    ) -> Any:
        policy = parse_policy(request.validation_policy or "none")
        binding = await self.registry.update_policy(
            request.topic_name, policy, request.enable_payload_validation
        )
        return pb.UpdateTopicValidationPolicyResponse(
            success=True, message=f"Topic {request.topic_name} validation policy {binding.policy.value}"
        )

    @unary
    async def GetTopicSchemaConfig(self, request: pb.GetTopicSchemaConfigRequest, context: Ctx) -> Any:
        name = TopicName.parse(request.topic_name)
        binding = await self.registry.topic_binding(name.full)
        if binding is None:
            if not await self.registry.topic_exists(name):
                raise NotFound(f"topic {name} does not exist")
            return pb.GetTopicSchemaConfigResponse(validation_policy="none")
        return pb.GetTopicSchemaConfigResponse(
            schema_subject=binding.subject,
            validation_policy=binding.policy.value,
            enable_payload_validation=binding.payload_validation,
            schema_id=binding.schema_id,
        )

    @unary
    async def ListSubjects(self, request: pb.ListSubjectsRequest, context: Ctx) -> Any:
        return pb.ListSubjectsResponse(
            subjects=[
                pb.SubjectSummary(
                    subject=s.subject,
                    schema_type=s.schema_type,
                    latest_version=s.latest_version,
                    compatibility_mode=s.compatibility_mode.value,
                    schema_id=s.schema_id,
                    tags=s.tags,
                )
                for s in await self.registry.list_subjects()
            ]
        )


def add_schema_service(server: Any, broker: BrokerService) -> None:
    add_service(server, SchemaRegistryServicer(broker.schemas), pb, "SchemaRegistry")
