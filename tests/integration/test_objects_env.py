"""The durable tier configured the way docs/configuration.md says works: only the standard AWS_* environment
variables (no `storage.durable.options`), SeaweedFS on a plain-HTTP endpoint, a real standalone broker."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from ister.client import Client
from ister.core.record import decode_message
from ister.storage.objects import open_store
from tests.integration.harness import BrokerProcess
from tests.seaweed_server import ACCESS_KEY, REGION, SECRET_KEY, SeaweedServer
from tests.support import until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOPIC = "/default/env_configured"
COUNT = 3_000


def wal_first_offset(data_dir: Path) -> int | None:
    """The first offset the broker still holds in local WAL files (files are named by first offset)."""
    directory = data_dir / "wal" / "default" / "env_configured"
    starts = [int(p.name.split(".")[0]) for p in directory.iterdir() if p.name.split(".")[0].isdigit()]
    return min(starts) if starts else None


@pytest.mark.parametrize("endpoint_var", ["AWS_ENDPOINT", "AWS_ENDPOINT_URL"])
async def test_broker_exports_with_only_aws_environment(
    seaweed: SeaweedServer, tmp_path: Path, endpoint_var: str
) -> None:
    prefix = f"env-{uuid.uuid4().hex[:8]}"
    env = {
        # The store: nothing but the standard variables (AWS_ALLOW_HTTP as the docs say; an http:// endpoint
        # alone would allow plain HTTP too).
        endpoint_var: seaweed.endpoint,
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_REGION": REGION,
        # Where, and test-sized export settings, so that the WAL drops what it exported within seconds.
        "ISTER_STORAGE__DURABLE__URL": f"{seaweed.url}/{prefix}",
        "ISTER_STORAGE__DURABLE__EXPORT_INTERVAL_SECONDS": "0.3",
        "ISTER_STORAGE__DURABLE__SEGMENT_MAX_AGE_SECONDS": "0.5",
        "ISTER_STORAGE__DURABLE__LOCAL_RETENTION_BYTES": "0",
        "ISTER_STORAGE__DURABLE__LOCAL_RETENTION_SECONDS": "0",
        "ISTER_WAL__SEGMENT_MAX_BYTES": "16384",
    }
    broker = BrokerProcess(tmp_path / "data", env=env)
    broker.start()
    try:
        payloads = [b"env-%d" % i for i in range(COUNT)]
        async with Client(broker.url) as client:
            producer = await client.producer(TOPIC, max_batch_messages=100)
            assert await producer.send_batch(payloads) == list(range(COUNT))

            # The local WAL lets go of offset 0 only once its segment is in a recorded object.
            await until(
                lambda: (wal_first_offset(broker.data_dir) or 0) > 0,
                "the first WAL segment exported and deleted locally",
                60,
            )
            span = await client.offsets(TOPIC)
            assert (span.earliest, span.next) == (0, COUNT)
            assert span.durable_url == f"{seaweed.url}/{prefix}"

            # The objects are in the bucket (seen through a store configured explicitly) ...
            store = open_store(f"{seaweed.url}/{prefix}", seaweed.options())
            keys = [o.key for o in await store.list(span.object_prefix)]
            assert any(k.rsplit("/", 1)[-1].startswith("data-0-") for k in keys), keys

            # ... and the broker reads the exported offsets back from them.
            started = time.monotonic()
            got: list[tuple[int, bytes]] = []
            async for batch in client.read(TOPIC, 0, COUNT):
                got += batch
            assert [o for o, _ in got] == list(range(COUNT))
            assert [decode_message(r).payload for _, r in got] == payloads
            assert time.monotonic() - started < 30
        assert "builder error" not in broker.log()
    finally:
        broker.stop()
