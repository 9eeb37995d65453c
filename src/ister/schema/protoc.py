"""Compile a `.proto` definition to descriptors with protoc (grpcio-tools), in a child process so that
its diagnostics can be read and a pathological input cannot take the broker down. Only the well-known
types (`google/protobuf/*.proto`) may be imported."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from ister.core.schema import PROTO_FILE_NAME, parse
from ister.core.schema.types import SchemaType
from ister.errors import InvalidArgument
from ister.ids import clip

if TYPE_CHECKING:
    from ister.core.schema.protobuf import ProtobufSchema

PROTOC_TIMEOUT_SECONDS = 20.0


def _well_known_dir() -> str:
    import grpc_tools  # type: ignore[import-untyped]

    return str(Path(grpc_tools.__file__).parent / "_proto")


def _command(workdir: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{workdir}",
        f"-I{_well_known_dir()}",
        "--include_imports",
        f"--descriptor_set_out={os.path.join(workdir, 'out.pb')}",
        PROTO_FILE_NAME,
    ]


def _failure(stderr: bytes) -> InvalidArgument:
    text = stderr.decode(errors="replace").strip().replace(f"{PROTO_FILE_NAME}:", "line ")
    return InvalidArgument(f"invalid Protobuf schema: {clip(text) or 'protoc failed'}")


def compile_proto_sync(text: str) -> bytes:
    """A FileDescriptorSet of the definition and its imports; InvalidArgument with protoc's diagnostics."""
    with tempfile.TemporaryDirectory(prefix="ister-proto-") as workdir:
        Path(workdir, PROTO_FILE_NAME).write_text(text)
        try:
            done = subprocess.run(
                _command(workdir), cwd=workdir, capture_output=True, timeout=PROTOC_TIMEOUT_SECONDS
            )
        except subprocess.TimeoutExpired:
            raise InvalidArgument("invalid Protobuf schema: protoc did not finish in time") from None
        if done.returncode != 0:
            raise _failure(done.stderr)
        return Path(workdir, "out.pb").read_bytes()


async def compile_proto(text: str) -> bytes:
    """`compile_proto_sync` on a worker thread (the child process is killed after its timeout)."""
    return await asyncio.to_thread(compile_proto_sync, text)


def parse_proto_sync(text: str) -> ProtobufSchema:
    from ister.core.schema.protobuf import ProtobufSchema  # protobuf's descriptors load on first use

    schema = parse(SchemaType.PROTOBUF, text, compile_proto_sync(text))
    assert isinstance(schema, ProtobufSchema)
    return schema
