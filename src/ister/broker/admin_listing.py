"""`IsterAdmin.ListTopics`: one page of the topic list, searched, sorted and counted on the broker.

What costs at 100,000 topics is a topic's delivery: one metadata read per topic not loaded here. Names
come from one listing per namespace and owners from one listing of the assignments, so a page sorted by
name or owner reads the deliveries of its own rows only. Sorting by delivery reads every matching topic's.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ister.broker.admin_base import AdminBase
from ister.broker.admin_values import TopicInfo
from ister.errors import InvalidArgument
from ister.ids import TopicName
from ister.metadata import keys

SORTS = ("name", "broker", "delivery")
MAX_LIMIT = 1_000


@dataclass(frozen=True, slots=True)
class TopicPage:
    topics: list[TopicInfo]  # the page, in the order asked
    total: int  # topics (of the namespace, when one is given) before the filter
    matched: int  # topics whose name contains the filter
    per_broker: dict[int, int] = field(default_factory=dict)  # matched topics per owner
    unassigned: int = 0  # matched topics without an owner now (cluster mode)
    namespaces: int = 0  # namespaces listed (1 when one was asked for)


class TopicListing(AdminBase):
    async def list_topics(
        self,
        namespace: str = "",
        name_filter: str = "",
        sort: str = "",
        descending: bool = False,
        offset: int = 0,
        limit: int = 50,
    ) -> TopicPage:
        """The `limit` topics from `offset` of those whose full name contains `name_filter`
        (case-insensitive), sorted by `sort` (name by default; ties by name), with the counts."""
        sort = sort or "name"
        if sort not in SORTS:
            raise InvalidArgument(f"sort must be one of {', '.join(SORTS)}, not {sort!r}")
        if not 0 <= limit <= MAX_LIMIT:
            raise InvalidArgument(f"limit must be 0..{MAX_LIMIT} (0: the counts only), not {limit}")
        if namespace:
            await self._require_namespace(namespace)
        spaces, names = await self._topic_names(namespace)
        needle = name_filter.strip().lower()
        matched = [n for n in names if needle in n.lower()] if needle else names
        owners = await self.placement_admin.owners_by_name(matched)
        counts = Counter(b for b in owners.values() if b is not None)
        if sort == "name":
            matched.sort(reverse=descending)
        elif sort == "broker":
            # Unassigned topics last (first when descending); owners compare as the console shows them.
            matched.sort(key=lambda n: (_owner_key(owners[n]), n), reverse=descending)
        else:
            every = dict(zip(matched, await self._deliveries([_name(n) for n in matched]), strict=True))
            matched.sort(key=lambda n: (every[n], n), reverse=descending)
        chosen = matched[offset : offset + limit]
        if sort == "delivery":
            deliveries = [every[n] for n in chosen]
        else:
            deliveries = await self._deliveries([_name(n) for n in chosen])
        page = [TopicInfo(n, owners[n], d) for n, d in zip(chosen, deliveries, strict=True)]
        unassigned = len(owners) - counts.total()
        return TopicPage(page, len(names), len(matched), dict(counts), unassigned, spaces)

    async def _topic_names(self, namespace: str) -> tuple[int, list[str]]:
        """(namespaces seen, their topics) from one listing: of `/namespaces/` (every namespace's keys,
        which hold its topic keys anyway) or of one namespace's topics.

        Names are taken as the broker wrote them, checked for shape only: validating 100,000 names again
        costs more than the rest of a page, and every name here passed TopicName.parse when it was made.
        """
        prefix = keys.namespace_topics_prefix(namespace) if namespace else keys.NAMESPACES_PREFIX
        spaces: set[str] = set()
        found: list[str] = []
        for kv in await self._list_all(prefix):
            parts = kv.key[len(keys.NAMESPACES_PREFIX) :].split("/")
            if parts[0]:
                spaces.add(parts[0])
            # /namespaces/{ns}/topics/{ns}/{topic} (Danube's layout, docs/metadata.md)
            if len(parts) == 4 and parts[1] == "topics" and parts[0] and parts[2] == parts[0] and parts[3]:
                found.append(f"/{parts[0]}/{parts[3]}")
        return len(spaces), found


def _name(full: str) -> TopicName:
    """A listed name (shape checked by `_topic_names`) as a TopicName, without validating it again."""
    _, namespace, topic = full.split("/")
    return TopicName(namespace, topic)


def _owner_key(owner: int | None) -> tuple[int, str]:
    """Owners sort as the console shows them (decimal text); no owner after every owner."""
    return (1, "") if owner is None else (0, str(owner))
