"""What the table worker needs to build a topic's table shape (`tables/shapes.py`), in picklable form: the
parsed schemas (compiled validators, generated Protobuf classes) do not pickle, so the broker passes the
registry's stored version records and the worker parses them. No heavy imports: the broker loads this."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True, eq=True)
class ShapeSpec:
    """A typed topic's table shape: its subject's versions, oldest first, as the registry stores them
    (`schema_type`, `schema_def`, `descriptor_set` for Protobuf); the last is the one records convert by.
    A bytes topic has no spec (None)."""

    subject: str
    versions: tuple[tuple[int, Any], ...]  # (version, stored record)

    @property
    def version(self) -> int:
        return self.versions[-1][0]


__all__ = ["ShapeSpec"]
