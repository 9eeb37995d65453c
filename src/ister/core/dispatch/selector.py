"""Which consumer gets a message: the part shared by reliable and non-reliable dispatch.

Consumers are registered by id. `attach` means a stream is open; `detach` means the stream is gone but the
consumer may come back with the same id; `remove` forgets it.

- EXCLUSIVE: one consumer. Attaching a different id while another is attached raises FailedPrecondition;
  a different consumer that is only detached is replaced (the broker decides who may take over).
- FAILOVER: the active consumer is the attached one that attached earliest. When it detaches the next
  attached standby takes over at once; a consumer that comes back queues behind the current active one.
  A partitioned subscription's coordinator may *designate* the active consumer instead (`designate`):
  then only that consumer receives, and nobody while it is None or not attached (a partition handing off).
- SHARED: exact round-robin over attached consumers in registration order.
- KEY_SHARED: the hash ring over attached consumers, narrowed to those whose key filters match.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ister.core.dispatch.keyhash import HashRing, filters_match
from ister.core.dispatch.types import SubType
from ister.errors import FailedPrecondition, InvalidArgument

MAX_KEY_FILTERS = 64
MAX_KEY_FILTER_LEN = 1_024
KEY_CACHE_SIZE = 65_536  # Key-Shared: remembered key -> owner decisions (cleared on any change)


@dataclass(slots=True)
class _Consumer:
    filters: tuple[str, ...]
    attached: bool
    seq: int  # when it last attached; the lowest attached seq is the failover active one


def normalize_filters(key_filters: Iterable[str]) -> tuple[str, ...]:
    filters = tuple(key_filters)
    if len(filters) > MAX_KEY_FILTERS:
        raise InvalidArgument(f"too many key filters: {len(filters)} > {MAX_KEY_FILTERS}")
    for f in filters:
        if not isinstance(f, str) or len(f) > MAX_KEY_FILTER_LEN:
            raise InvalidArgument(f"invalid key filter {f!r}")
    return filters


class ConsumerSelector:
    def __init__(self, sub_type: SubType) -> None:
        self.sub_type = SubType(sub_type)
        self._consumers: dict[int, _Consumer] = {}
        self._order: list[int] = []  # registration order, for round-robin
        self._rr = 0
        self._seq = 0
        self._active: int | None = None
        self._designating = False
        self._designated: int | None = None
        self._ring: HashRing | None = None
        self._attached_count = 0
        self._any_filters = False
        # Key-Shared decisions already made since the last change: key -> owner (read it, never write it)
        self.key_owners: dict[str, int | None] = {}
        self.version = 0  # bumped whenever the attached set or a filter changes

    # -- membership --------------------------------------------------------------------------------------
    def attach(self, consumer_id: int, key_filters: Iterable[str] = ()) -> bool:
        """Open a consumer's stream; returns True if the attached set or its filters changed."""
        filters = normalize_filters(key_filters) if self.sub_type is SubType.KEY_SHARED else ()
        if self.sub_type is SubType.EXCLUSIVE:
            others = [cid for cid in self._consumers if cid != consumer_id]
            if any(self._consumers[cid].attached for cid in others):
                raise FailedPrecondition("exclusive subscription already has an attached consumer")
            for cid in others:
                self.remove(cid)
        consumer = self._consumers.get(consumer_id)
        if consumer is None:
            self._seq += 1
            self._consumers[consumer_id] = _Consumer(filters, True, self._seq)
            self._order.append(consumer_id)
        elif consumer.attached and consumer.filters == filters:
            return False
        else:
            if not consumer.attached:
                self._seq += 1
                consumer.seq = self._seq
                consumer.attached = True
            consumer.filters = filters
        self._changed()
        return True

    def detach(self, consumer_id: int) -> bool:
        consumer = self._consumers.get(consumer_id)
        if consumer is None or not consumer.attached:
            return False
        consumer.attached = False
        self._changed()
        return True

    def remove(self, consumer_id: int) -> bool:
        consumer = self._consumers.pop(consumer_id, None)
        if consumer is None:
            return False
        index = self._order.index(consumer_id)
        del self._order[index]
        if index < self._rr:
            self._rr -= 1
        if self._order:
            self._rr %= len(self._order)
        else:
            self._rr = 0
        self._changed()
        return True

    def _changed(self) -> None:
        self.version += 1
        self._ring = None
        self.key_owners.clear()
        attached = [(c.seq, cid) for cid, c in self._consumers.items() if c.attached]
        self._attached_count = len(attached)
        self._active = min(attached)[1] if attached and self.sub_type.single_active else None
        if self._designating:
            d = self._designated
            self._active = d if d is not None and self.is_attached(d) else None
        self._any_filters = any(c.filters for c in self._consumers.values() if c.attached)

    @property
    def designation(self) -> tuple[bool, int | None]:
        """(whether a coordinator designates the consumer, the designated one)."""
        return self._designating, self._designated

    def designate(self, consumer_id: int | None) -> None:
        """Failover: only `consumer_id` receives from now on (None: nobody, deliveries pause)."""
        if self.sub_type is not SubType.FAILOVER:
            raise InvalidArgument(
                f"only a Failover subscription takes a designated consumer, not {self.sub_type}"
            )
        self._designating, self._designated = True, consumer_id
        self._changed()

    def undesignate(self) -> None:
        """Back to the earliest attached consumer."""
        if self._designating:
            self._designating, self._designated = False, None
            self._changed()

    @property
    def designated(self) -> int | None:
        return self._designated

    # -- queries -----------------------------------------------------------------------------------------
    def is_known(self, consumer_id: int) -> bool:
        return consumer_id in self._consumers

    def is_attached(self, consumer_id: int) -> bool:
        consumer = self._consumers.get(consumer_id)
        return consumer is not None and consumer.attached

    @property
    def has_attached(self) -> bool:
        return self._attached_count > 0

    def attached_ids(self) -> list[int]:
        return [cid for cid in self._order if self._consumers[cid].attached]

    def known_ids(self) -> list[int]:
        return list(self._order)

    def active(self) -> int | None:
        """Exclusive/Failover: the one consumer that receives messages now (None for the other types)."""
        return self._active

    def next_round_robin(self) -> int | None:
        """The next attached consumer in round-robin order (advances the turn)."""
        n = len(self._order)
        for i in range(n):
            index = (self._rr + i) % n
            cid = self._order[index]
            if self._consumers[cid].attached:
                self._rr = (index + 1) % n
                return cid
        return None

    def round_robin_order(self) -> list[int]:
        """The attached consumers in the order round-robin picks them from now on (cycling)."""
        rr = self._rr
        order = self._order[rr:] + self._order[:rr]
        return [cid for cid in order if self._consumers[cid].attached]

    def skip_round_robin(self, count: int) -> None:
        """Advance the turn exactly as `count` calls of `next_round_robin` would."""
        ring = self.round_robin_order()
        if ring and count > 0:
            last = ring[(count - 1) % len(ring)]
            self._rr = (self._order.index(last) + 1) % len(self._order)

    def for_key(self, key: str) -> int | None:
        """Key-Shared owner of `key` among attached consumers whose filters match it."""
        cache = self.key_owners
        if key in cache:
            return cache[key]
        owner = self._for_key(key)
        if len(key) <= 256:  # bound the cache's memory by short keys only
            if len(cache) >= KEY_CACHE_SIZE:
                cache.clear()
            cache[key] = owner
        return owner

    def _for_key(self, key: str) -> int | None:
        if self._attached_count == 0:
            return None
        if self._ring is None:
            self._ring = HashRing(cid for cid, c in self._consumers.items() if c.attached)
        if not self._any_filters:
            return self._ring.lookup(key)
        eligible = {cid for cid, c in self._consumers.items() if c.attached and filters_match(c.filters, key)}
        if not eligible:
            return None
        if len(eligible) == 1:
            return next(iter(eligible))
        return self._ring.lookup(key, eligible)

    def route(self, key: str) -> int | None:
        """The consumer for the next message of this subscription type, or None if nobody can take it."""
        if self.sub_type.single_active:
            return self._active
        if self.sub_type is SubType.SHARED:
            return self.next_round_robin()
        return self.for_key(key)
