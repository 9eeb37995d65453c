"""The parts of one subscription's reliable dispatch state (reliable.py), and the checks they share.

`StateParts` builds them: the consumer selector, the in-flight table, the key queues (Key-Shared), the
held window and the failure handling, and the counters `stats` reports. The state's methods come in
layers over it, one responsibility each: `outcomes.py` (acks, nacks, timeouts, dead letters),
`sending.py` (what a poll sends), `reliable.py` (consumers, feeding, queries).
"""

from __future__ import annotations

from ister.core.dispatch.failures import Failures
from ister.core.dispatch.flight import FlightTable
from ister.core.dispatch.keyqueue import KeyQueues
from ister.core.dispatch.policy import FailurePolicy
from ister.core.dispatch.selector import ConsumerSelector
from ister.core.dispatch.types import SubType
from ister.core.dispatch.window import HeldWindow
from ister.errors import InvalidArgument
from ister.limits import KEY_SHARED_UNMATCHED_LIMIT, MAX_WINDOW, MIN_WINDOW


def check_window(window: object) -> int:
    if isinstance(window, bool) or not isinstance(window, int) or not MIN_WINDOW <= window <= MAX_WINDOW:
        raise InvalidArgument(f"dispatch window must be in {MIN_WINDOW}..{MAX_WINDOW}, got {window!r}")
    return window


class StateParts:
    def __init__(
        self,
        sub_type: SubType,
        *,
        start_offset: int,
        window: int,
        policy: FailurePolicy,
        track_resolved: bool = False,
        unmatched_limit: int = KEY_SHARED_UNMATCHED_LIMIT,
    ) -> None:
        """`track_resolved`: record resolved offsets for `take_resolved` (then call it regularly).
        `unmatched_limit`: Key-Shared messages of keys no consumer accepts that may wait outside the window.
        """
        self.window = check_window(window)
        self._unmatched_limit = max(0, unmatched_limit)
        if isinstance(start_offset, bool) or not isinstance(start_offset, int) or start_offset < 0:
            raise InvalidArgument(f"start offset must be a non-negative integer, got {start_offset!r}")
        self.sub_type = SubType(sub_type)
        self._key_shared = self.sub_type is SubType.KEY_SHARED
        self._shared = self.sub_type is SubType.SHARED
        self._selector = ConsumerSelector(self.sub_type)
        self._flight = FlightTable()
        self._holder = self._flight.holder
        self._kq = KeyQueues()  # used by Key-Shared only
        self._w = HeldWindow(
            start_offset, self._holder, self._kq if self._key_shared else None, track_resolved
        )
        self._entries = self._w.entries
        self._failures = Failures(policy, self._w)
        self._retries = self._failures.retries
        self._delivered = self._redelivered = self._acked = self._nacked = self._timeouts = 0

    @property
    def policy(self) -> FailurePolicy:
        return self._failures.policy

    @policy.setter
    def policy(self, policy: FailurePolicy) -> None:
        self._failures.policy = policy
