"""IsterAdmin.ResetCursor and PeekMessages: a topic, a partition or a partitioned topic's base name (every
partition), answered by any broker. Each concrete topic is served by its owner: here when this broker owns
it, else the request for that topic is forwarded once to the owner's admin API with the caller's
credentials (a forwarded request that finds the topic gone is UNAVAILABLE: retry)."""

from __future__ import annotations

import logging
from typing import Any

import grpc

from ister.broker.admin_ops import AdminOps
from ister.client.errors import to_ister_error
from ister.errors import FailedPrecondition, Unavailable
from ister.ids import TopicName, validate_client_name
from ister.server.cursor_convert import (
    move_to_wire,
    peek_start_from_wire,
    peeked_to_wire,
    position_from_wire,
)
from ister.wire.gen import ister_v1_pb2 as pb
from ister.wire.gen import ister_v1_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

FORWARDED = "x-ister-forwarded"  # metadata key: this request was forwarded by a broker (never again)
FORWARD_TIMEOUT_SECONDS = 20.0
PASSED_ON = ("authorization",)


class CursorAdmin:
    def __init__(self, ops: AdminOps) -> None:
        self.ops = ops
        self.broker = ops.broker

    async def reset(self, request: pb.ResetCursorRequest, context: Any) -> pb.ResetCursorResponse:
        position = position_from_wire(request)
        validate_client_name(request.subscription, "subscription name")
        _, targets = await self.ops._resolve(request.topic)
        for name in targets:
            await self.ops._require_reliable(name, "a cursor reset")
        # Every partition is checked (subscription, position) before the first one moves.
        checked = [await self._reset_one(name, request, context, dry_run=True) for name in targets]
        if request.dry_run:
            return pb.ResetCursorResponse(positions=checked)
        moved = [await self._reset_one(name, request, context, dry_run=False) for name in targets]
        log.info("admin: reset cursor %s of %s to %s", request.subscription, request.topic, str(position))
        return pb.ResetCursorResponse(positions=moved)

    async def _reset_one(
        self, name: TopicName, request: pb.ResetCursorRequest, context: Any, *, dry_run: bool
    ) -> pb.CursorPosition:
        if await self._here(name, context):
            move = await self.broker.seek_cursor(
                name.full,
                request.subscription,
                position_from_wire(request),
                create=False,
                dry_run=dry_run,
            )
            return move_to_wire(move)
        one = pb.ResetCursorRequest()
        one.CopyFrom(request)
        one.topic = name.full
        one.dry_run = dry_run

        async def call(stub: Any, metadata: list[tuple[str, str]]) -> Any:
            return await stub.ResetCursor(one, metadata=metadata, timeout=FORWARD_TIMEOUT_SECONDS)

        answer = await self._forward(name, context, call)
        return answer.positions[0]  # type: ignore[no-any-return]

    async def peek(self, request: pb.PeekMessagesRequest, context: Any) -> pb.PeekMessagesResponse:
        start = peek_start_from_wire(request)
        _, targets = await self.ops._resolve(request.topic)
        for name in targets:
            await self.ops._require_reliable(name, "peek")
        out = pb.PeekMessagesResponse()
        for name in targets:
            if await self._here(name, context):
                found = await self.broker.peek(name.full, start, request.count)
                out.messages.extend(peeked_to_wire(p) for p in found)
                continue
            one = pb.PeekMessagesRequest()
            one.CopyFrom(request)
            one.topic = name.full

            async def call(stub: Any, metadata: list[tuple[str, str]], one: Any = one) -> Any:
                return await stub.PeekMessages(one, metadata=metadata, timeout=FORWARD_TIMEOUT_SECONDS)

            answer = await self._forward(name, context, call)
            out.messages.extend(answer.messages)
        return out

    # -- where a topic is served ------------------------------------------------------------------------
    async def _here(self, name: TopicName, context: Any) -> bool:
        """True when this broker serves `name` (or may load it: standalone, or owner of it)."""
        if name.full in self.broker.topics:
            return True
        owner = await self.ops.placement_admin.owner(name)
        if owner is None:
            raise Unavailable(f"no broker serves {name} right now (it is being assigned); retry")
        if owner == self.ops.broker_id:
            return True
        if _forwarded(context):
            raise Unavailable(f"{name} moved to broker {owner} meanwhile; retry")
        return False

    async def _forward(self, name: TopicName, context: Any, call: Any) -> Any:
        owner = await self.ops.placement_admin.owner(name)
        if owner is None:
            raise Unavailable(f"no broker serves {name} right now (it is being assigned); retry")
        where = await self.ops.placement_admin.admin_addr_of(owner)
        target = _plain_target(where)
        if target is None:
            raise FailedPrecondition(
                f"{name} is served by broker {owner}; send the request to its admin API ({where})"
            )
        metadata = [(k, v) for k, v in _metadata(context) if k in PASSED_ON]
        metadata.append((FORWARDED, "1"))
        async with grpc.aio.insecure_channel(target) as channel:
            stub = pb_grpc.IsterAdminStub(channel)
            try:
                return await call(stub, metadata)
            except grpc.aio.AioRpcError as exc:
                err = to_ister_error(exc)
                if exc.code() is grpc.StatusCode.UNAVAILABLE and "moved" not in str(err):
                    raise Unavailable(f"broker {owner} ({where}), which serves {name}: {err}") from None
                raise err from None


def _metadata(context: Any) -> list[tuple[str, str]]:
    try:
        return [(str(k), str(v)) for k, v in context.invocation_metadata() or ()]
    except Exception:
        return []


def _forwarded(context: Any) -> bool:
    return any(k == FORWARDED for k, _ in _metadata(context))


def _plain_target(addr: str) -> str | None:
    """HOST:PORT of a plaintext admin address (`http://HOST:PORT` or `HOST:PORT`); None for TLS ones
    (forwarding over TLS would need a trust root for the other broker: not done)."""
    if addr.startswith("https://"):
        return None
    target = addr.removeprefix("http://").rstrip("/")
    return target if ":" in target else None
