"""In-memory indexes of the topic list for `IsterAdmin.ListTopics` (issue 42), kept from watches the broker
already runs, so a page of a name-sorted listing costs O(namespaces + page), not O(topics).

`TopicNames`: every topic's full name, sorted per namespace, from the mirror of `/namespaces/` (the
retention view's cache). `Assignments`: each topic's owner and the count per (namespace, broker), from the
mirror of `/cluster/` (the cluster node's cache). Both apply the keys changed since the last read (a
`ChangeFeed`), or rebuild after a re-list or a burst of changes. Like the mirrors, they may be a moment
behind the store (the watch's delay).
"""

from __future__ import annotations

import asyncio
import bisect
from collections import Counter
from collections.abc import Iterator

from ister.metadata import keys
from ister.metadata.cache import LocalCache

# Past this many changed keys, rebuilding (one sort) is cheaper than inserting each name into its list.
REBUILD_AFTER = 2_000
# `follow` applies changes at most this often: a burst of creations is applied in a few batches.
FOLLOW_PAUSE_SECONDS = 0.2


def _topic_of(key: str) -> tuple[str, str] | None:
    """(namespace, full name) of a `/namespaces/{ns}/topics/{ns}/{topic}` key (Danube's layout)."""
    parts = key[len(keys.NAMESPACES_PREFIX) :].split("/")
    if len(parts) == 4 and parts[1] == "topics" and parts[0] and parts[2] == parts[0] and parts[3]:
        return parts[0], f"/{parts[0]}/{parts[3]}"
    return None


def _space_order(namespace: str) -> str:
    """Namespaces in the order of their topics' full names: `/a-b/x` sorts before `/a/x`."""
    return namespace + "/"


class _Index:
    """An index kept from the keys of one prefix of a mirror that changed since it last looked."""

    def __init__(self, cache: LocalCache, prefix: str) -> None:
        self._cache = cache
        self._feed = cache.feed(prefix)

    def _refresh(self) -> None:
        raise NotImplementedError

    async def follow(self) -> None:
        """Apply the mirror's changes as they come (a task of the broker's), so a listing seldom has any
        left to apply: at 100,000 topics a build takes about 0.4 s, which no request should wait for."""
        while True:
            changed = self._cache.change_event()
            self._refresh()
            await changed.wait()
            await asyncio.sleep(FOLLOW_PAUSE_SECONDS)


class TopicNames(_Index):
    def __init__(self, cache: LocalCache) -> None:
        super().__init__(cache, keys.NAMESPACES_PREFIX)
        self._names: dict[str, list[str]] = {}  # namespace -> its topics' full names, sorted
        self._spaces: list[str] = []  # namespaces with any key, in `_space_order`

    def _refresh(self) -> None:
        reset, changed = self._feed.drain()
        if reset or len(changed) > REBUILD_AFTER:
            self._rebuild()
            return
        touched: set[str] = set()
        for key in changed:
            namespace = key[len(keys.NAMESPACES_PREFIX) :].partition("/")[0]
            if namespace:
                touched.add(namespace)
            found = _topic_of(key)
            if found is None:
                continue
            names = self._names.setdefault(found[0], [])
            at = bisect.bisect_left(names, found[1])
            present = at < len(names) and names[at] == found[1]
            if self._cache.get(key) is not None and not present:
                names.insert(at, found[1])
            elif self._cache.get(key) is None and present:
                del names[at]
        if touched:
            spaces = set(self._spaces)
            for namespace in touched:
                if self._cache.count(f"{keys.NAMESPACES_PREFIX}{namespace}/"):  # as stored: no re-validation
                    spaces.add(namespace)
                else:
                    spaces.discard(namespace)
                    self._names.pop(namespace, None)
            self._spaces = sorted(spaces, key=_space_order)

    def _rebuild(self) -> None:
        names: dict[str, list[str]] = {}
        spaces: set[str] = set()
        for kv in self._cache.list(keys.NAMESPACES_PREFIX):
            namespace = kv.key[len(keys.NAMESPACES_PREFIX) :].partition("/")[0]
            if namespace:
                spaces.add(namespace)
            found = _topic_of(kv.key)
            if found is not None:
                names.setdefault(found[0], []).append(found[1])
        for listed in names.values():
            listed.sort()
        self._names, self._spaces = names, sorted(spaces, key=_space_order)

    def namespaces(self) -> list[str]:
        self._refresh()
        return list(self._spaces)

    def count(self, namespace: str = "") -> int:
        self._refresh()
        if namespace:
            return len(self._names.get(namespace, ()))
        return sum(len(n) for n in self._names.values())

    def names(self, namespace: str = "") -> list[str]:
        """Every full name (of `namespace`, when given), sorted."""
        self._refresh()
        if namespace:
            return list(self._names.get(namespace, ()))
        return [n for space in self._spaces for n in self._names.get(space, ())]

    def page(self, namespace: str, offset: int, limit: int, descending: bool) -> list[str]:
        """Names `offset` to `offset + limit` in name order (or its reverse): O(namespaces + limit)."""
        self._refresh()
        spaces = [namespace] if namespace else self._spaces
        lists = [self._names.get(s, []) for s in spaces]
        if descending:
            return _take(reversed(lists), offset, limit, reverse=True)
        return _take(iter(lists), offset, limit, reverse=False)


def _take(lists: Iterator[list[str]], offset: int, limit: int, reverse: bool) -> list[str]:
    out: list[str] = []
    for names in lists:
        if len(out) >= limit:
            break
        if offset >= len(names):
            offset -= len(names)
            continue
        want = limit - len(out)
        if reverse:
            end = len(names) - offset
            out.extend(reversed(names[max(0, end - want) : end]))
        else:
            out.extend(names[offset : offset + want])
        offset = 0
    return out


class Assignments(_Index):
    """topic -> owner broker, and how many topics each broker owns per namespace."""

    def __init__(self, cache: LocalCache) -> None:
        super().__init__(cache, keys.BROKERS_PREFIX)
        self._owner: dict[str, int] = {}
        self._counts: Counter[tuple[str, int]] = Counter()

    def _refresh(self) -> None:
        reset, changed = self._feed.drain()
        if reset or len(changed) > REBUILD_AFTER:
            listed = keys.assignments(kv.key for kv in self._cache.list(keys.BROKERS_PREFIX))
            self._owner = listed
            self._counts = Counter((_space(t), b) for t, b in listed.items())
            return
        for key in changed:
            for topic, broker in keys.assignments([key]).items():
                if self._cache.get(key) is not None:
                    self._set(topic, broker)
                elif self._owner.get(topic) == broker:
                    self._set(topic, None)

    def _set(self, topic: str, broker: int | None) -> None:
        old = self._owner.pop(topic, None)
        if old is not None:
            self._counts[(_space(topic), old)] -= 1
        if broker is not None:
            self._owner[topic] = broker
            self._counts[(_space(topic), broker)] += 1

    def owner(self, topic: str) -> int | None:
        self._refresh()
        return self._owner.get(topic)

    def owners(self, topics: list[str]) -> dict[str, int | None]:
        self._refresh()
        return {t: self._owner.get(t) for t in topics}

    def per_broker(self, namespace: str = "") -> dict[int, int]:
        """Topics each broker owns (of `namespace`, when given)."""
        self._refresh()
        out: Counter[int] = Counter()
        for (space, broker), n in self._counts.items():
            if n > 0 and (not namespace or space == namespace):
                out[broker] += n
        return dict(out)


def _space(full: str) -> str:
    return full.split("/", 2)[1]
