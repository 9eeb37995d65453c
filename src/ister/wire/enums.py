"""Enum fields of the wire, checked: proto3 hands unknown values over as plain integers, and each one is
refused (INVALID_ARGUMENT) instead of being read as the default. Used by the Danube, batch and admin APIs."""

from __future__ import annotations

from ister.core.dispatch import SubType
from ister.errors import InvalidArgument

# danube.DispatchStrategy, danube_admin.DispatchStrategy and ister.v1.Delivery share these numbers.
_RELIABILITY = {0: False, 1: True}
_ACCESS_MODES = (0, 1)  # danube.ProducerAccessMode: Shared, Exclusive


def reliable_from_wire(value: int, field: str) -> bool:
    """True for Reliable (1), False for NonReliable (0); InvalidArgument for any other value."""
    reliable = _RELIABILITY.get(value)
    if reliable is None:
        raise InvalidArgument(f"unknown {field} {value}: expected 0 (NonReliable) or 1 (Reliable)")
    return reliable


def access_mode_from_wire(value: int) -> int:
    if value not in _ACCESS_MODES:
        raise InvalidArgument(f"unknown producer_access_mode {value}: expected 0 (Shared) or 1 (Exclusive)")
    return value


def sub_type_from_wire(value: int) -> SubType:
    try:
        return SubType(value)
    except ValueError:
        raise InvalidArgument(
            f"unknown subscription type {value}: expected 0 (Exclusive), 1 (Shared), 2 (Failover) "
            "or 3 (KeyShared)"
        ) from None


def initial_position_from_wire(value: int) -> bool:
    """ConsumeOpen.initial_position: True for EARLIEST, False for LATEST (the default, as Danube)."""
    if value not in (0, 1):
        raise InvalidArgument(f"unknown initial position {value}: expected 0 (Latest) or 1 (Earliest)")
    return value == 1
