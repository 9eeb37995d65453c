from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.harness import BrokerProcess

_names = itertools.count()
FAST_RETRY_ENV = {
    "ISTER_DISPATCH__BACKOFF_STRATEGY": "Fixed",
    "ISTER_DISPATCH__BASE_REDELIVERY_DELAY_MS": "100",
}


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker for a whole test module; tests use unique topic names."""
    # Short fixed redelivery delays keep the nack and dead-letter tests quick.
    broker = BrokerProcess(tmp_path_factory.mktemp("broker") / "data", env=FAST_RETRY_ENV)
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture
def fresh_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker of the test's own, for restart and crash tests."""
    broker = BrokerProcess(tmp_path / "data")
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    return f"/default/{request.node.name.replace('[', '_').replace(']', '').replace('-', '_')}_{next(_names)}"
