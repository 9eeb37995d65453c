"""One registry and one validator per broker, found from the broker object by the servicers that need
them (client port, admin port) without the broker facade knowing about schemas."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

from ister.schema.registry import SchemaRegistry
from ister.schema.validation import PayloadValidator

if TYPE_CHECKING:
    from ister.broker.service import BrokerService

_REGISTRIES: weakref.WeakKeyDictionary[BrokerService, tuple[SchemaRegistry, PayloadValidator]] = (
    weakref.WeakKeyDictionary()
)


def _pair(broker: BrokerService) -> tuple[SchemaRegistry, PayloadValidator]:
    found = _REGISTRIES.get(broker)
    if found is None:
        registry = SchemaRegistry(broker.store, broker.topic_exists)
        found = (registry, PayloadValidator(registry))
        _REGISTRIES[broker] = found
    return found


def registry_for(broker: BrokerService) -> SchemaRegistry:
    return _pair(broker)[0]


def validator_for(broker: BrokerService) -> PayloadValidator:
    return _pair(broker)[1]


async def start_schemas(broker: BrokerService) -> None:
    await registry_for(broker).start()


async def close_schemas(broker: BrokerService) -> None:
    found = _REGISTRIES.pop(broker, None)
    if found is not None:
        await found[0].close()
