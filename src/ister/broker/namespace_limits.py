"""`max_topics_per_namespace` (docs/limits.md): checked against the metadata store's own listing of the
namespace's topics (etcd in cluster mode, so every broker counts the same topics), before a topic is
created by a producer or the admin API. Each partition of a partitioned topic counts as one topic.

Two brokers creating the namespace's last allowed topic at the same instant can both pass (the check and the
creation are not one transaction): the count can exceed the limit by the creations in flight at once.
"""

from __future__ import annotations

from ister.broker import metrics
from ister.errors import FailedPrecondition, NotFound
from ister.ids import shown
from ister.metadata import keys
from ister.metadata.records import NamespacePolicy
from ister.metadata.store import MetadataStore


async def check_topic_room(store: MetadataStore, ns: str, count: int = 1) -> None:
    """FailedPrecondition naming the limit when `count` more topics would exceed the namespace's
    `max_topics_per_namespace`; nothing is written either way."""
    kv = await store.get(keys.namespace_policy(ns))
    if kv is None:
        raise NotFound(f"namespace {shown(ns)} does not exist")
    limit = NamespacePolicy.lenient(kv.value).max_topics_per_namespace
    if not limit:
        return
    held = len(await store.list(keys.namespace_topics_prefix(ns), limit=limit + count))
    if held + count > limit:
        metrics.limit_refusals.labels("max_topics_per_namespace").inc()
        raise FailedPrecondition(
            f"namespace {ns} allows max_topics_per_namespace={limit} topics and holds {held}"
            + (f"; {count} more were asked for" if count > 1 else "")
        )
