"""A namespace policy asking for zstd dictionaries, against a real standalone broker (docs/compression.md,
"Dictionaries"): each topic of the namespace trains its own dictionary on its first plain records (their ids
differ), every reader gets the records back equal (the Danube wire, the Ister client's Read and Consume,
peek), a restarted broker still reads them, and once the namespace policy no longer asks for a dictionary
the next records are stored with plain zstd."""

from __future__ import annotations

import json
import time

import pytest

from ister.core import zdict
from ister.core.compression import ENVELOPE_SIZE, Codec, uses_dictionary
from tests.integration.compression_support import log_lines, read_payloads
from tests.integration.harness import BrokerProcess, client, consumer, producer, take
from tests.integration.test_compression import cli
from tests.integration.test_compression_dict import _consume, _publish, wal_records

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
N = 2000
NS = "nslogs"


def _compression(b: BrokerProcess, topic: str) -> dict[str, object]:
    out: dict[str, object] = json.loads(cli(b, "admin", "topics", "compression", topic, "--output", "json"))
    return out


def _dictionary_of(b: BrokerProcess, topic: str) -> int:
    """The topic's dictionary id once trained (in the background: each CLI call is the wait between looks)."""
    deadline = time.monotonic() + 60
    while not isinstance(dict_id := _compression(b, topic).get("dictionary_id"), int):
        assert time.monotonic() < deadline, f"{topic}: no dictionary within 60 s"
    return dict_id


async def test_each_topic_of_a_dictionary_namespace_trains_its_own(fresh_broker: BrokerProcess) -> None:
    b = fresh_broker
    cli(b, "admin", "namespaces", "create", NS)
    shown = cli(b, "admin", "namespaces", "set-compression", NS, "zstd", "--dictionary")
    assert "zstd (namespace), a dictionary per topic" in shown
    policies = json.loads(cli(b, "admin", "namespaces", "policies", NS, "--output", "json"))
    assert policies["compression"] == "zstd" and policies["compression_dictionary"] is True
    topics = {f"/{NS}/a": log_lines(N, seed=1), f"/{NS}/b": log_lines(N, seed=2)}
    danube = await client(b.url)
    for t in topics:
        await producer(danube, t, "setup", reliable=True)  # the topic exists
    cons, queue = await consumer(danube, f"/{NS}/a", "danube", "s")
    # sampling: the table says so, JSON has no id yet
    assert _compression(b, f"/{NS}/a") == {
        "name": f"/{NS}/a",
        "compression": "zstd",
        "source": "namespace",
        "dictionary": True,
        "dictionary_id": None,
    }
    assert "zstd (namespace), dictionary (sampling)" in cli(b, "admin", "topics", "compression", f"/{NS}/a")

    for t, lines in topics.items():  # 500 of them are sampled, then each topic trains its dictionary
        await _publish(b.url, t, lines[:1000])
    ids = {t: _dictionary_of(b, t) for t in topics}
    assert ids[f"/{NS}/a"] != ids[f"/{NS}/b"], ids
    for t, lines in topics.items():
        await _publish(b.url, t, lines[1000:])

    lines_a, lines_b = topics[f"/{NS}/a"], topics[f"/{NS}/b"]
    got = await take(queue, N, within=60, ack=cons)
    assert [m.payload for m in got] == lines_a  # the Danube wire: plain payloads
    for t, lines in topics.items():
        assert await read_payloads(b.url, t) == lines  # the Ister client's Read
        peek = ["admin", "topics", "peek", t, "--from", "1990", "-n", "10", "--output", "json"]
        assert [m["payload"].encode() for m in json.loads(cli(b, *peek))] == lines[1990:]
    assert await _consume(b.url, f"/{NS}/b", N) == lines_b  # the Ister client's Consume stream

    # the namespace no longer asks for a dictionary: the next records are plain zstd
    assert "dictionary" not in cli(b, "admin", "namespaces", "set-compression", NS, "zstd")
    assert _compression(b, f"/{NS}/a") == {"name": f"/{NS}/a", "compression": "zstd", "source": "namespace"}
    more = log_lines(20, seed=3)
    await _publish(b.url, f"/{NS}/a", more)

    b.terminate()  # the WAL as stored, then a restart that must load the dictionaries from metadata
    for t in topics:
        stored = wal_records(b.data_dir, t.rsplit("/", 1)[1], NS)
        assert all(uses_dictionary(r) for r in stored[1000:N])  # each record after the sample, with
        used = {zdict.dict_id_of(r[ENVELOPE_SIZE:]) for r in stored[1000:N]}
        assert used == {ids[t]}, (t, used)  # the topic's own dictionary
        tail = stored[N:]  # after the change: plain zstd
        assert len(tail) == (len(more) if t.endswith("/a") else 0)
        assert all(r[1] == Codec.ZSTD and not uses_dictionary(r) for r in tail)
        dict_bytes = sum(map(len, stored[1000:N]))
        print(f"{t}: dictionary {ids[t]}, records 1000..1999 stored in {dict_bytes} bytes")

    b.start()
    assert await read_payloads(b.url, f"/{NS}/a") == lines_a + more
    assert await read_payloads(b.url, f"/{NS}/b") == lines_b
