"""The cluster's health for the overview and the rebalancing page: one IsterAdmin.GetClusterHealth call
(recent moves with their reasons, failed moves, under-replicated and under-min-ISR topics), which the
broker answers from its metadata cache, so it costs the same at any topic count."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import grpc

from ister.wire.gen import ister_v1_pb2 as ister_pb

CALL_TIMEOUT_SECONDS = 5.0


def when(unix_seconds: float) -> str:
    """A past time as people read it on a live page: how long ago, and the UTC time."""
    if not unix_seconds:
        return "-"
    ago = max(0.0, time.time() - unix_seconds)
    shown = f"{ago:.0f} s ago" if ago < 120 else f"{ago / 60:.0f} min ago"
    return f"{shown} ({time.strftime('%H:%M:%S', time.gmtime(unix_seconds))} UTC)"


def retry(failed: Any) -> str:
    """When the load manager may try a failed move again."""
    if not failed.backing_off:
        return "any time"
    wait = max(0.0, failed.retry_at - time.time())
    return f"in {wait:.0f} s ({time.strftime('%H:%M:%S', time.gmtime(failed.retry_at))} UTC)"


@dataclass
class Health:
    """`note`: why the lists are empty or missing (standalone, a token without ManageCluster, an error)."""

    shown: bool = False
    mode: str = ""
    note: str = ""
    moves: list[Any] = field(default_factory=list)
    moves_total: int = 0
    failed: list[Any] = field(default_factory=list)
    under_replicated: list[Any] = field(default_factory=list)
    under_min_isr: list[Any] = field(default_factory=list)
    replicated_topics: int = 0

    @property
    def bad(self) -> bool:
        return bool(self.failed or self.under_replicated or self.under_min_isr)


async def health(ister_admin: Any, max_moves: int = 10) -> Health:
    """The cluster's health; a failed call gives `shown=False` and a note in the broker's words."""
    try:
        r = await ister_admin.GetClusterHealth(
            ister_pb.ClusterHealthRequest(max_moves=max_moves), timeout=CALL_TIMEOUT_SECONDS
        )
    except grpc.RpcError as exc:
        code = exc.code()
        if code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
            return Health(note=f"this token may not read the cluster's health: {exc.details()}")
        return Health(note=f"could not read the cluster's health: {exc.details()} ({code.name})")
    return Health(
        shown=True,
        mode=r.mode,
        note=r.note,
        moves=list(r.moves),
        moves_total=r.moves_total,
        failed=list(r.failed_moves),
        under_replicated=list(r.under_replicated),
        under_min_isr=list(r.under_min_isr),
        replicated_topics=r.replicated_topics,
    )
