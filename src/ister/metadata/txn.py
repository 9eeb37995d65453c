"""The input check of a metadata transaction, shared by the backends (embedded and etcd).

`check_txn` validates compares and ops before anything changes and returns them as a `TxnPlan` (values
encoded, each key at most once); the backend then evaluates the compares and applies the ops its own way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ister.errors import InvalidArgument
from ister.metadata.store import MAX_TXN_OPS, Compare, Delete, Op, Put, check_key, encode_value


@dataclass(frozen=True, slots=True)
class TxnPlan:
    """A validated transaction: compares, then ops in the caller's order (`raw` None for a delete)."""

    compares: list[Compare]
    ops: list[tuple[str, bytes | None, int | None]]  # (key, encoded value or None, lease)


def check_txn(compares: Sequence[Compare], ops: Sequence[Op]) -> TxnPlan:
    """Validate a transaction's input (shared by the backends); InvalidArgument before anything changes.

    At most MAX_TXN_OPS compares and MAX_TXN_OPS ops, valid keys and versions, JSON-encodable values,
    integer leases, and each key at most once among the ops. Lease liveness is the backend's to check.
    """
    if isinstance(compares, str | bytes) or isinstance(ops, str | bytes):
        raise InvalidArgument("txn compares and ops must be sequences of Compare and Put/Delete")
    try:
        compare_list = list(compares)
        op_list = list(ops)
    except TypeError as exc:
        raise InvalidArgument(f"txn compares and ops must be sequences: {exc}") from exc
    for what, items in (("compares", compare_list), ("ops", op_list)):
        if len(items) > MAX_TXN_OPS:
            raise InvalidArgument(f"txn has {len(items)} {what}, limit {MAX_TXN_OPS}")
    for compare in compare_list:
        if not isinstance(compare, Compare):
            raise InvalidArgument(f"invalid txn compare {compare!r}: expected a Compare")
        check_key(compare.key)
        if compare.version is not None:
            check_version(compare.version)
    planned: list[tuple[str, bytes | None, int | None]] = []
    seen: set[str] = set()
    for op in op_list:
        if isinstance(op, Put):
            check_key(op.key)
            raw: bytes | None = encode_value(op.value)
            if op.lease is not None and (isinstance(op.lease, bool) or not isinstance(op.lease, int)):
                raise InvalidArgument(f"invalid lease id {op.lease!r}")
            lease = op.lease
        elif isinstance(op, Delete):
            check_key(op.key)
            raw, lease = None, None
        else:
            raise InvalidArgument(f"invalid txn op {op!r}: expected a Put or a Delete")
        if op.key in seen:
            raise InvalidArgument(f"txn touches key {op.key!r} more than once")
        seen.add(op.key)
        planned.append((op.key, raw, lease))
    return TxnPlan(compare_list, planned)


def check_version(version: object) -> None:
    """An expected version (a compare's, or a guarded put's or delete's) is a positive revision."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise InvalidArgument(f"invalid expected_version {version!r}: expected a positive revision")
