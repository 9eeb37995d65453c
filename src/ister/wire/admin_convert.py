"""Admin requests to Ister's types. Kept apart from `convert`, which imports the generated `DanubeApi`
module: a process that also loads the official client's copy of that proto (tests, tools) may not load
ours."""

from __future__ import annotations

from typing import Any

from ister.core.replication_policy import ReplicationSetting


def replication_from_wire(request: Any) -> ReplicationSetting | None:
    """The optional `replication_factor` / `min_insync_replicas` of an admin request (NewTopicRequest,
    PartitionedTopicRequest, SetNamespaceReplicationRequest); None when neither is given. Checked later,
    where the inherited factor is known."""
    factor = request.replication_factor if request.HasField("replication_factor") else None
    min_insync = request.min_insync_replicas if request.HasField("min_insync_replicas") else None
    if factor is None and min_insync is None:
        return None
    return ReplicationSetting(factor, min_insync)
