"""Exactly-once from Spark: a task's rows are published so that any re-run of the task (a retried task, a
micro-batch replayed after the driver restarted from its checkpoint) makes the same batches under the same
producer keys and sequences, which the broker's idempotence (docs/idempotence.md) stores once.

* Key: one per (query id, micro-batch id, Spark partition, destination topic or partition), a hash of the
  four: fresh for each micro-batch, so its sequences start at 0 and never need the previous batch's count.
* Batches: the rows of one destination in task order, cut greedily by the producer's batch limits (and
  all at once when the task holds too much unsent), a function of the rows alone, not of timing or of
  Spark's Arrow batches.
* Routing: rows of a partitioned topic without a `partition` column go, keyed, where the producer would send
  them (FNV-1a); unkeyed, in runs of ROUTE_RUN rows from partition (Spark partition mod n), instead of the
  producer's round robin, which follows timing.

A batch answered `DuplicateSequence` was stored by an earlier attempt beyond what the broker remembers of its
batches (64 per key): it counts as written. docs/spark.md, "Exactly once", says what this covers.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ister.client.blocking import BlockingProducer
from ister.client.producer import Outgoing
from ister.client.routing import fnv1a_64
from ister.core.stream_offsets import TopicPartition
from ister.errors import DuplicateSequence

ROUTE_RUN = 1_000  # unkeyed rows per partition in turn
MAX_UNSENT_MESSAGES = 65_536  # rows a task holds in open batches before it sends them all
MAX_UNSENT_BYTES = 64 * 1024 * 1024


def producer_key(query_id: str, batch_id: str, partition_id: int, destination: str) -> int:
    """The idempotence key of a task's rows for one destination: the same on every attempt, non-zero."""
    text = f"{query_id}\0{batch_id}\0{partition_id}\0{destination}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big") or 1


@dataclass
class _Open:
    """One destination's batch being filled."""

    producer: BlockingProducer
    max_count: int
    max_bytes: int
    messages: list[Outgoing] = field(default_factory=list)
    nbytes: int = 0


class ExactSends:
    """One task's rows → batches a re-run makes again. `producer(destination, key)` opens a producer with
    that fixed key; `partitions(topic)` lists a topic's partition topics (in index order; [] when it has
    none or does not exist)."""

    def __init__(
        self,
        producer: Callable[[str, int], BlockingProducer],
        partitions: Callable[[str], list[str]],
        query_id: str,
        batch_id: str,
        partition_id: int,
        in_flight: int,
    ) -> None:
        self._producer = producer
        self._partitions = partitions
        self._ids = (query_id, batch_id, partition_id)
        self._in_flight_max = in_flight
        self._open: dict[str, _Open] = {}
        self._parts: dict[str, list[str]] = {}
        self._unkeyed: dict[str, int] = {}  # per partitioned topic: unkeyed rows routed so far
        self._unsent = 0
        self._unsent_bytes = 0
        self._in_flight: deque[concurrent.futures.Future[int]] = deque()

    def route(self, topic: str, key: str | None) -> str:
        """Where a row without a `partition` column goes: `topic`, or one of its partitions."""
        parts = self._parts.get(topic)
        if parts is None:
            found = self._partitions(topic)
            parts = self._parts[topic] = sorted(found, key=lambda n: TopicPartition.of(n).partition)
        n = len(parts)
        if n <= 1:
            return topic
        if key is not None:
            return parts[fnv1a_64(key) % n]
        done = self._unkeyed.get(topic, 0)
        self._unkeyed[topic] = done + 1
        return parts[(self._ids[2] + done // ROUTE_RUN) % n]

    def add(self, destination: str, message: Outgoing) -> None:
        batch = self._open.get(destination)
        if batch is None:
            producer = self._producer(destination, producer_key(*self._ids, destination))
            count, nbytes = producer.producer.batch_limits()
            batch = self._open[destination] = _Open(producer, count, nbytes)
        size = batch.producer.producer.message_size(*message)
        if batch.messages and batch.nbytes + size > batch.max_bytes:
            self._send(batch)
        batch.messages.append(message)
        batch.nbytes += size
        self._unsent += 1
        self._unsent_bytes += size
        if len(batch.messages) >= batch.max_count:
            self._send(batch)
        if self._unsent >= MAX_UNSENT_MESSAGES or self._unsent_bytes >= MAX_UNSENT_BYTES:
            for other in self._open.values():
                if other.messages:
                    self._send(other)

    def _send(self, batch: _Open) -> None:
        self._in_flight.append(batch.producer.send_whole_async(batch.messages))
        self._unsent -= len(batch.messages)
        self._unsent_bytes -= batch.nbytes
        batch.messages = []
        batch.nbytes = 0
        while len(self._in_flight) > self._in_flight_max:
            _stored(self._in_flight.popleft())

    def finish(self) -> None:
        """Send what is left and wait until every batch is stored (raises the first failure)."""
        for batch in self._open.values():
            if batch.messages:
                self._send(batch)
        while self._in_flight:
            _stored(self._in_flight.popleft())


def _stored(future: concurrent.futures.Future[int]) -> None:
    # DuplicateSequence: stored by an earlier attempt, beyond the batches the broker remembers with offsets
    with contextlib.suppress(DuplicateSequence):
        future.result()
