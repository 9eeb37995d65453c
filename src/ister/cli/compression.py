"""`ister admin namespaces set-compression/compression` and `ister admin topics set-compression/compression`
(docs/compression.md): the codec a topic's records are stored with when their producer sent them plain."""

from __future__ import annotations

from typing import Annotated

import typer

from ister.cli.admin import (
    DEFAULT_ADMIN_ADDR,
    AdminAddr,
    Output,
    OutputOpt,
    TopicArg,
    call,
    emit_fields,
    emit_json,
    fail,
    namespaces_app,
    topic_name,
    topics_app,
)
from ister.cli.compression_show import dictionary_fields, shown
from ister.wire.gen import ister_v1_pb2 as ister_pb

CODECS = "none, lz4, zstd, snappy or gzip"


def _emit(output: Output, what: str, r: ister_pb.CompressionResponse, topic: bool = True) -> None:
    if output == Output.json:
        fields = {"name": what, "compression": r.compression, "source": r.source}
        emit_json(fields | dictionary_fields(r, topic))
        return
    emit_fields([("name", what), ("compression", shown(r, topic))])


@namespaces_app.command("set-compression")
def namespaces_set_compression(
    namespace: Annotated[str, typer.Argument(help="namespace")],
    compression: Annotated[str | None, typer.Argument(help=CODECS)] = None,
    clear: Annotated[bool, typer.Option("--clear", help="drop the namespace's codec (none)")] = False,
    dictionary: Annotated[
        bool, typer.Option("--dictionary", help="zstd: each topic trains a dictionary on its first records")
    ] = False,
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> None:
    """Set the codec the namespace's topics store plain-sent records with (from the next publish on)."""
    if (compression is None) != clear:
        fail("give a compression or --clear" + (", not both" if clear else ""))
    request = ister_pb.SetCompressionRequest(
        namespace=namespace, compression=compression or "", clear=clear, dictionary=dictionary
    )
    response = call(admin_addr, lambda s: s.ister_admin.SetCompression(request, timeout=30.0))
    _emit(output, namespace, response, topic=False)


@namespaces_app.command("compression")
def namespaces_compression(
    namespace: Annotated[str, typer.Argument(help="namespace")],
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> None:
    """A namespace's compression."""
    request = ister_pb.GetCompressionRequest(namespace=namespace)
    response = call(admin_addr, lambda s: s.ister_admin.GetCompression(request, timeout=30.0))
    _emit(output, namespace, response, topic=False)


@topics_app.command("set-compression")
def topics_set_compression(
    topic: TopicArg,
    compression: Annotated[str | None, typer.Argument(help=CODECS)] = None,
    clear: Annotated[bool, typer.Option("--clear", help="drop the topic's own codec")] = False,
    dictionary: Annotated[
        bool, typer.Option("--dictionary", help="zstd: train a dictionary on the topic's first records")
    ] = False,
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> None:
    """Set a topic's own codec, overriding its namespace's (each partition of a partitioned topic)."""
    if (compression is None) != clear:
        fail("give a compression or --clear" + (", not both" if clear else ""))
    name = topic_name(topic)
    request = ister_pb.SetCompressionRequest(
        topic=name, compression=compression or "", clear=clear, dictionary=dictionary
    )
    _emit(output, name, call(admin_addr, lambda s: s.ister_admin.SetCompression(request, timeout=30.0)))


@topics_app.command("compression")
def topics_compression(
    topic: TopicArg,
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> None:
    """The codec in effect for a topic and where it comes from (topic, namespace or default)."""
    name = topic_name(topic)
    request = ister_pb.GetCompressionRequest(topic=name)
    _emit(output, name, call(admin_addr, lambda s: s.ister_admin.GetCompression(request, timeout=30.0)))
