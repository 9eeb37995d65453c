"""Key-Shared with the official client, repeated (issue 14 item 0): two consumers on one subscription of a
reliable topic, messages sent with `send_with_key`, each acked as soon as it arrives; every message must
arrive, in order per key, and a key stays with one consumer while the consumer set does not change.

Each round uses a fresh topic (so fresh consumer ids and ring placements) and sends at a different point
of the second consumer's arrival: before it subscribes, between its subscribe and its receive, or after
both receive and the broker has both delivery streams open (the client opens them in the background after
`receive()`). No sleeps: what is waited for is the messages themselves, and the broker's word.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable

import danube
import pytest

from tests.integration.harness import BrokerProcess, client, consumer, producer, take, until_attached
from tests.support import until

pytestmark = pytest.mark.integration
S = danube.SubType
ROUNDS = 24
WITHIN = 20.0  # a bound for a failure report, not a timing assertion
_topics = itertools.count()

RING_KEYS = ("k1", "k2")
FILTERED = {"a": ["payment"], "b": ["ship*", "invoice"]}
FILTER_KEYS = ["payment", "shipping", "payment", "invoice", "payment"]


class Receiver:
    """Drains one consumer's queue, acking each message as soon as it arrives."""

    def __init__(self, name: str, got: list[tuple[str, str, int]]) -> None:
        self.name = name
        self.got = got
        self.task: asyncio.Task[None] | None = None

    def start(self, cons: danube.Consumer, queue: asyncio.Queue) -> None:  # type: ignore[type-arg]
        async def drain() -> None:
            while True:
                m = await queue.get()
                self.got.append((self.name, m.routing_key, int(m.payload)))
                await cons.ack(m)

        self.task = asyncio.create_task(drain())


async def _round(
    broker: BrokerProcess, keys: list[str], filters: dict[str, list[str]] | None, phase: int
) -> None:
    url = broker.url
    topic = f"/default/ks_rounds_{next(_topics)}"
    c = await client(url)
    p = await producer(c, topic, "p", reliable=True)
    got: list[tuple[str, str, int]] = []
    sent = 0

    async def send(upto: int) -> None:
        nonlocal sent
        while sent < upto:
            await p.send_with_key(str(sent).encode(), {}, keys[sent])
            sent += 1

    def build(name: str) -> danube.Consumer:
        b = c.new_consumer().with_topic(topic).with_consumer_name(name).with_subscription("ks")
        b = b.with_subscription_type(S.KEY_SHARED)
        if filters is not None:
            b = b.with_key_filters(filters[name])
        return b.build()

    a, b = build("a"), build("b")
    ra, rb = Receiver("a", got), Receiver("b", got)
    await a.subscribe()
    ra.start(a, await a.receive())
    third = len(keys) // 3
    if phase == 0:
        await send(third)  # only A is there (filters: B's keys wait for B)
    await b.subscribe()
    if phase <= 1:
        await send(2 * third)  # B subscribed, its stream not open yet
    rb.start(b, await b.receive())
    if phase == 2:  # "both receiving" as the broker sees it: a message sent earlier could only go to A
        for name in ("a", "b"):
            await until_attached(broker.admin_addr, topic, "ks", name)
    await send(len(keys))
    try:
        await until(
            lambda: {i for _, _, i in got} == set(range(len(keys))),
            lambda: f"every message on {topic}; got {got}",
            WITHIN,
        )
    finally:
        for r in (ra, rb):
            assert r.task is not None
            r.task.cancel()
        await a.close()
        await b.close()
    firsts: dict[int, tuple[str, str]] = {}
    for name, key, i in got:
        assert key == keys[i]
        firsts.setdefault(i, (name, key))
    for key in set(keys):
        order = [i for i, (_, k) in firsts.items() if k == key]  # first arrivals, in arrival order
        assert order == sorted(order), f"{topic}: {key} out of order: {got}"
    if phase == 2:  # both consumers were receiving before the first send: no key moves
        owners = {(k, name) for name, k in firsts.values()}
        assert len(owners) == len(set(keys)), f"{topic}: a key went to both consumers: {got}"
    if filters is not None:
        for name, key in firsts.values():
            assert any(_glob(f, key) for f in filters[name]), f"{topic}: {key} went to {name}: {got}"


def _glob(pattern: str, key: str) -> bool:
    return pattern == key or (pattern.endswith("*") and key.startswith(pattern[:-1]))


Round = Callable[[BrokerProcess, int], Awaitable[None]]


async def _ring(broker: BrokerProcess, n: int) -> None:
    keys = [f"{RING_KEYS[i % 2]}-{n}" for i in range(10)]  # two keys, alternating; new names each round
    await _round(broker, keys, None, n % 3)


async def _filters(broker: BrokerProcess, n: int) -> None:
    await _round(broker, FILTER_KEYS, FILTERED, n % 3)


@pytest.mark.parametrize("scenario", [_ring, _filters], ids=["ring", "filters"])
async def test_key_shared_every_message_arrives(shared_broker: BrokerProcess, scenario: Round) -> None:
    for n in range(ROUNDS):
        await scenario(shared_broker, n)


async def test_unmatched_key_waits_without_stalling_other_keys(shared_broker: BrokerProcess) -> None:
    """Messages of a key no consumer's filters accept wait for one, outside the dispatch window (10 by
    default): twelve of them used to fill it, and the other keys' messages behind them never arrived."""
    topic = f"/default/ks_unmatched_{next(_topics)}"
    c = await client(shared_broker.url)
    p = await producer(c, topic, "p", reliable=True)
    a, qa = await consumer(c, topic, "a", "ks", S.KEY_SHARED, ["payment"])
    for i in range(12):
        await p.send_with_key(f"s{i}".encode(), {}, "shipping")
    for i in range(3):
        await p.send_with_key(f"p{i}".encode(), {}, "payment")
    got = await take(qa, 3, within=WITHIN, ack=a)
    assert [m.payload for m in got] == [b"p0", b"p1", b"p2"]
    b, qb = await consumer(c, topic, "b", "ks", S.KEY_SHARED, ["ship*"])
    got = await take(qb, 12, within=WITHIN, ack=b)
    assert [m.payload for m in got] == [f"s{i}".encode() for i in range(12)]
    await a.close()
    await b.close()
