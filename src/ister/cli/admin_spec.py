"""One admin command as data, and the one runner of them all.

A command is a typer function whose signature declares its arguments (typer turns it into flags) and
whose body only builds a `Spec`: what to ask the broker (`ask`, given the admin API's stubs) and how the
answer is shown, as a table (`table`) and as `-o json` (`json`). `admin_command` registers it and runs
the spec: connect, call (failures: `error: <message>`, exit 1), show. Usage errors raised while the spec
is built stop the command before anything is sent (exit 2).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, ParamSpec, TypeVar

import typer

from ister.cli.admin_call import CALL_TIMEOUT_SECONDS, Stubs, call
from ister.cli.admin_show import Output, emit_json, emit_table

R = TypeVar("R")
P = ParamSpec("P")


@dataclass(frozen=True)
class Spec(Generic[R]):
    """What one command asks the broker, and how its answer `R` is shown."""

    ask: Callable[[Stubs], R]
    table: Callable[[R], None]
    json: Callable[[R], object]


def rpc(
    service: str, method: str, request: Any, timeout: float = CALL_TIMEOUT_SECONDS
) -> Callable[[Stubs], Any]:
    """One call: `service` names a field of `Stubs`, `method` one of its RPCs."""
    return lambda stubs: getattr(getattr(stubs, service), method)(request, timeout=timeout)


def done(ask: Callable[[Stubs], R], message: str, **fields: Any) -> Spec[R]:
    """A command that changes something: `message` for people, `{"success": true, **fields}` as JSON."""
    return done_with(ask, lambda _: message, lambda _: fields)


def done_with(
    ask: Callable[[Stubs], R], message: Callable[[R], str], fields: Callable[[R], Mapping[str, Any]]
) -> Spec[R]:
    """`done` whose message and fields come from the answer."""
    return Spec(
        ask, lambda answer: typer.echo(message(answer)), lambda answer: {"success": True, **fields(answer)}
    )


def listing(
    ask: Callable[[Stubs], R],
    items: Callable[[R], list[Any]],
    headers: Sequence[str],
    row: Callable[[Any], Sequence[object]],
) -> Spec[R]:
    """A list: the items as JSON, one table row per item (`(none)` for none)."""
    return Spec(ask, lambda answer: emit_table(headers, [row(i) for i in items(answer)]), items)


def run(spec: Spec[Any], admin_addr: str, output: Output) -> None:
    answer = call(admin_addr, spec.ask)
    if output == Output.json:
        emit_json(spec.json(answer))
    else:
        spec.table(answer)


def admin_command(app: typer.Typer, name: str) -> Callable[[Callable[P, Spec[Any]]], Callable[P, None]]:
    """Register a spec-building function as command `name` of `app` (its parameters must include
    `admin_addr` and `output`)."""

    def register(build: Callable[P, Spec[Any]]) -> Callable[P, None]:
        @functools.wraps(build)
        def command(*args: P.args, **kwargs: P.kwargs) -> None:
            run(build(*args, **kwargs), kwargs["admin_addr"], kwargs["output"])  # type: ignore[arg-type]

        app.command(name)(command)
        return command

    return register
