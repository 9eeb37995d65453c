"""Dispatch state machines: consumer selection, the reliable window with redelivery and poison handling,
and non-reliable routing. Pure logic: time comes in as `now_ms`."""

from ister.core.dispatch.entries import EntryState
from ister.core.dispatch.gaps import split_runs
from ister.core.dispatch.keyhash import HashRing, glob_match, key_hash
from ister.core.dispatch.nonreliable import NonReliableRouter
from ister.core.dispatch.outcomes import ACK_TIMEOUT_REASON
from ister.core.dispatch.policy import BackoffStrategy, FailurePolicy, PoisonPolicy
from ister.core.dispatch.reliable import ReliableSubscriptionState
from ister.core.dispatch.selector import ConsumerSelector
from ister.core.dispatch.sending import Group
from ister.core.dispatch.types import DeadLetter, Delivery, SubscriptionStats, SubType
from ister.core.dispatch.window import CursorTracker

__all__ = [
    "ACK_TIMEOUT_REASON",
    "BackoffStrategy",
    "ConsumerSelector",
    "CursorTracker",
    "DeadLetter",
    "Delivery",
    "EntryState",
    "FailurePolicy",
    "Group",
    "HashRing",
    "NonReliableRouter",
    "PoisonPolicy",
    "ReliableSubscriptionState",
    "SubType",
    "SubscriptionStats",
    "glob_match",
    "key_hash",
    "split_runs",
]
