"""`IsterAdmin.ListTopics`: one page of the topic list, searched, sorted and counted on the broker.

Names and owners come from indexes the broker keeps from its watches of the metadata store
(metadata/topic_index.py), not from listing the store per call. A page in name order, without a search,
costs O(namespaces + page) at any topic count: the counts are the indexes' and only the page's rows have
their delivery read (one metadata read per topic not loaded here). A search scans the names in memory, a
sort by owner sorts them in memory, and a sort by delivery reads a topic's delivery the first time only
(it is written once, when the topic is made) and then sorts in memory: linear in the topic count, with no
store read after the first (docs/console.md).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ister.broker.admin_base import AdminBase
from ister.broker.admin_values import TopicInfo
from ister.errors import InvalidArgument
from ister.ids import TopicName
from ister.metadata import keys
from ister.metadata.topic_index import Assignments

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
    # full name -> (revision of its `/namespaces/` key, delivery): a topic's delivery is written once, when
    # it is made, so a sort by delivery reads each topic's once; a topic made again has a new revision.
    _delivery_memo: dict[str, tuple[int, str]] | None = None

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
        # One read of the store: names and owners come from its mirror, which would go on answering
        # with the last it saw while the store is down; this makes such a listing fail instead.
        if namespace:
            await self._require_namespace(namespace)
        else:
            await self.store.get(keys.LEADER)
        index = self.broker.topic_names
        spaces = 1 if namespace else len(index.namespaces())
        total = index.count(namespace)
        assigned = self.placement_admin.owner_index()
        needle = name_filter.strip().lower()
        if not needle and sort == "name":  # the index's order: O(namespaces + page)
            chosen = index.page(namespace, offset, limit, descending)
            owners = self._owners(assigned, chosen)
            if assigned is None:
                per_broker = {self.broker_id: total} if total else {}
            else:
                per_broker = assigned.per_broker(namespace)
            unassigned = max(0, total - sum(per_broker.values()))
            deliveries = await self._deliveries([_name(n) for n in chosen])
            page = [TopicInfo(n, owners[n], d) for n, d in zip(chosen, deliveries, strict=True)]
            return TopicPage(page, total, total, per_broker, unassigned, spaces)
        names = index.names(namespace)
        matched = [n for n in names if needle in n.lower()] if needle else names
        owners = self._owners(assigned, matched)
        counts = Counter(b for b in owners.values() if b is not None)
        if sort == "name":
            matched.sort(reverse=descending)
        elif sort == "broker":
            # Unassigned topics last (first when descending); owners compare as the console shows them.
            matched.sort(key=lambda n: (_owner_key(owners[n]), n), reverse=descending)
        else:
            every = await self._remembered_deliveries(matched)
            matched.sort(key=lambda n: (every[n], n), reverse=descending)
        chosen = matched[offset : offset + limit]
        if sort == "delivery":
            deliveries = [every[n] for n in chosen]
        else:
            deliveries = await self._deliveries([_name(n) for n in chosen])
        page = [TopicInfo(n, owners[n], d) for n, d in zip(chosen, deliveries, strict=True)]
        unassigned = len(owners) - counts.total()
        return TopicPage(page, total, len(matched), dict(counts), unassigned, spaces)

    async def _remembered_deliveries(self, names: list[str]) -> dict[str, str]:
        """Each topic's delivery, read from the store only the first time (or after it was made again)."""
        memo = self._delivery_memo
        if memo is None or len(memo) > 2 * max(self.broker.topic_names.count(), 1_000):
            memo = self._delivery_memo = {}  # dropped topics' entries go, now and then
        cache = self.broker.retention_view.cache
        out: dict[str, str] = {}
        missing: list[tuple[str, int]] = []
        for n in names:
            kv = cache.get(_index_key(n))
            revision = kv.version if kv is not None else -1
            known = memo.get(n)
            if known is not None and known[0] == revision:
                out[n] = known[1]
            else:
                missing.append((n, revision))
        read = await self._deliveries([_name(n) for n, _ in missing])
        for (n, revision), delivery in zip(missing, read, strict=True):
            out[n] = delivery
            if revision >= 0:
                memo[n] = (revision, delivery)
        return out

    def _owners(self, assigned: Assignments | None, names: list[str]) -> dict[str, int | None]:
        if assigned is None:  # standalone: this broker owns every topic
            return dict.fromkeys(names, self.broker_id)
        return assigned.owners(names)


def _index_key(full: str) -> str:
    """A listed name's `/namespaces/{ns}/topics/{ns}/{topic}` key, as stored (not validated again)."""
    _, namespace, topic = full.split("/")
    return f"{keys.NAMESPACES_PREFIX}{namespace}/topics/{namespace}/{topic}"


def _name(full: str) -> TopicName:
    """A listed name (shape checked by `_topic_names`) as a TopicName, without validating it again."""
    _, namespace, topic = full.split("/")
    return TopicName(namespace, topic)


def _owner_key(owner: int | None) -> tuple[int, str]:
    """Owners sort as the console shows them (decimal text); no owner after every owner."""
    return (1, "") if owner is None else (0, str(owner))
