"""How the admin CLI shows an answer: aligned tables and `key: value` fields for people, JSON for
`--output json`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from enum import StrEnum
from typing import Any

import typer


class Output(StrEnum):
    table = "table"
    json = "json"


def emit_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, sort_keys=False))


def emit_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Aligned columns for people; cells are shown with str() (numbers too)."""
    if not rows:
        typer.echo("(none)")
        return
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    typer.echo("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip())
    for row in cells:
        typer.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def emit_fields(fields: Sequence[tuple[str, str]]) -> None:
    width = max(len(k) for k, _ in fields)
    for key, value in fields:
        typer.echo(f"{(key + ':').ljust(width + 1)} {value}")


def emit_done(output: Output, message: str, **extra: Any) -> None:
    if output == Output.json:
        emit_json({"success": True, **extra})
    else:
        typer.echo(message)
