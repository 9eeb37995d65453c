"""Registering servicers so that a request body that is not a valid protobuf message reaches the servicer.

The generated `add_*_to_server` functions hand gRPC the message classes' `FromString`, and a body that fails
to parse then ends the call inside gRPC with UNKNOWN (unary) or INTERNAL (streams, with a traceback in the
log). `add_service` registers the same methods with a deserializer that turns such a body into an
`Undecodable`, which the decorators of `ister.server.errors` answer with INVALID_ARGUMENT.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from types import ModuleType
from typing import Any

import grpc
from google.protobuf.message_factory import GetMessageClass  # type: ignore[import-untyped]


class Undecodable:
    """Stands for a request whose bytes are not a valid message of its type."""

    __slots__ = ("type_name",)

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name

    @property
    def message(self) -> str:
        return f"malformed request: the body is not a valid {self.type_name} message"


def _lenient(message_class: Any) -> Callable[[bytes], Any]:
    parse = message_class.FromString
    type_name = message_class.DESCRIPTOR.full_name

    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except Exception:  # DecodeError, or anything else the parser objects to: the body is bad input
            return Undecodable(type_name)

    return deserialize


_FACTORIES = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def add_service(
    server: Any, servicer: Any, pb_module: ModuleType, service: str, only: Collection[str] | None = None
) -> None:
    """Register `servicer` for `service` of the generated module `pb_module` (as its `add_*_to_server`
    does), with request deserializers that never fail; with `only`, just those methods (the others are
    UNIMPLEMENTED)."""
    descriptor = pb_module.DESCRIPTOR.services_by_name[service]
    handlers = {}
    for method in descriptor.methods:
        if only is not None and method.name not in only:
            continue
        request = GetMessageClass(method.input_type)
        response = GetMessageClass(method.output_type)
        factory = _FACTORIES[(method.client_streaming, method.server_streaming)]
        handlers[method.name] = factory(
            getattr(servicer, method.name),
            request_deserializer=_lenient(request),
            response_serializer=response.SerializeToString,
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(descriptor.full_name, handlers),))
    server.add_registered_method_handlers(descriptor.full_name, handlers)
