"""A compiled check of Avro binary datums: the publish path's validator under `enforce`.

Decoding a datum with fastavro builds every value (a dict per record, str objects, floats) only to throw
them away; validating needs none of that. From the parsed schema this module generates one Python
function that walks the encoding: varints are skipped, lengths read, fixed-size values stepped over,
strings checked as UTF-8 without being decoded when they are ASCII, and the datum must end exactly at the
payload's last byte. Records are inlined (named records referenced again, or recursively, get a function
of their own). Measured on bench/schema_bench.py's record it costs about a third of fastavro's decode.

It is exact against the specification's encoding, and never looser than fastavro: a datum it accepts
decodes. It is stricter than fastavro where fastavro tolerates what the specification forbids (a varint
longer than 10 bytes or an int outside 32 bits, which fastavro silently wraps; a boolean byte other than
0 or 1; a negative enum index, which fastavro reads as a Python negative index). Schemas with logical
types are not compiled (fastavro's conversions refuse values, e.g. out-of-range dates, that the binary
encoding allows): `compile_check` returns None and the caller decodes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class _Bad(Exception):
    """A datum that breaks the encoding (internal: the check returns False)."""


_ERRORS = (IndexError, _Bad, UnicodeDecodeError, RecursionError)
MAX_LONG_BYTES = 10


def _long(p: bytes, i: int) -> tuple[int, int]:
    """The zigzag varint at p[i] and the position after it (at most 10 bytes)."""
    b = p[i]
    v = b & 0x7F
    shift = 7
    i += 1
    while b & 0x80:
        if shift >= 7 * MAX_LONG_BYTES:
            raise _Bad
        b = p[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
    return (v >> 1) ^ -(v & 1), i


def _skip_long(p: bytes, i: int) -> int:
    start = i
    while p[i] & 0x80:
        i += 1
    i += 1
    if i - start > MAX_LONG_BYTES:
        raise _Bad
    return i


def _int(p: bytes, i: int) -> int:
    v, i = _long(p, i)
    if not -(2**31) <= v < 2**31:
        raise _Bad
    return i


class _Gen:
    def __init__(self) -> None:
        self.functions: dict[str, str] = {}  # record full name → function name
        self.sources: list[str] = []
        self.counter = 0
        self.inlined: set[str] = set()

    def var(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def read_long(self, target: str, pad: str) -> list[str]:
        """Lines setting `target` to the varint at i (one-byte values without a call)."""
        return [
            f"{pad}b = p[i]",
            f"{pad}if b & 0x80:",
            f"{pad}    {target}, i = _long(p, i)",
            f"{pad}else:",
            f"{pad}    {target} = (b >> 1) ^ -(b & 1)",
            f"{pad}    i += 1",
        ]

    def sized(self, pad: str, text: bool) -> list[str]:
        """bytes / string: a length, then that many bytes (UTF-8 for a string)."""
        lines = self.read_long("ln", pad)
        lines += [f"{pad}j = i + ln", f"{pad}if ln < 0 or j > n:", f"{pad}    raise _Bad"]
        if text:
            lines += [f"{pad}s = p[i:j]", f"{pad}if not s.isascii():", f"{pad}    s.decode()"]
        return [*lines, f"{pad}i = j"]

    def blocks(self, pad: str, body: Callable[[str], list[str]]) -> list[str]:
        """array / map: blocks of `count` items (a negative count is followed by the block's size)."""
        count = self.var("c")
        lines = [f"{pad}while True:"]
        lines += self.read_long(count, pad + "    ")
        lines += [
            f"{pad}    if {count} == 0:",
            f"{pad}        break",
            f"{pad}    if {count} < 0:",
            f"{pad}        {count} = -{count}",
            f"{pad}        i = _skip_long(p, i)",
            f"{pad}    for _ in range({count}):",
        ]
        return lines + body(pad + "        ")

    def code(self, s: Any, pad: str) -> list[str]:
        """Lines that step i over one value of `s`."""
        kind = s.type
        if s.props.get("logicalType") is not None:
            raise _Unsupported
        if kind == "null":
            return [f"{pad}pass"]
        if kind == "boolean":
            return [f"{pad}if p[i] > 1:", f"{pad}    raise _Bad", f"{pad}i += 1"]
        if kind == "int":
            return [f"{pad}if p[i] & 0x80:", f"{pad}    i = _int(p, i)", f"{pad}else:", f"{pad}    i += 1"]
        if kind == "long":
            return [
                f"{pad}if p[i] & 0x80:",
                f"{pad}    i = _skip_long(p, i)",
                f"{pad}else:",
                f"{pad}    i += 1",
            ]
        if kind in ("float", "double", "fixed"):
            size = {"float": 4, "double": 8}.get(kind) or int(s.size)
            return [f"{pad}i += {size}"]
        if kind in ("bytes", "string"):
            return self.sized(pad, kind == "string")
        if kind == "enum":
            index = self.var("e")
            return [
                *self.read_long(index, pad),
                f"{pad}if not 0 <= {index} < {len(s.symbols)}:",
                f"{pad}    raise _Bad",
            ]
        if kind == "union":
            return self.union(s.schemas, pad)
        if kind == "array":
            return self.blocks(pad, lambda inner: self.code(s.items, inner))
        if kind == "map":
            return self.blocks(pad, lambda inner: self.sized(inner, True) + self.code(s.values, inner))
        if kind in ("record", "error"):
            return self.record(s, pad)
        raise _Unsupported

    def union(self, branches: list[Any], pad: str) -> list[str]:
        index = self.var("u")
        lines = self.read_long(index, pad)
        for k, branch in enumerate(branches):
            lines.append(f"{pad}{'if' if k == 0 else 'elif'} {index} == {k}:")
            lines += self.code(branch, pad + "    ")
        return [*lines, f"{pad}else:", f"{pad}    raise _Bad"]

    def record(self, s: Any, pad: str) -> list[str]:
        name = s.fullname
        if name not in self.inlined:  # its first use: inline (records are usually used once)
            self.inlined.add(name)
            lines = [line for f in s.fields for line in self.code(f.type, pad)]
            return lines or [f"{pad}pass"]
        function = self.functions.get(name)
        if function is None:  # used again, or recursively: a function of its own
            function = self.functions[name] = self.var("_record")
            inline = self.inlined
            self.inlined = set(inline) | {name}
            body = [line for f in s.fields for line in self.code(f.type, "    ")]
            self.inlined = inline
            self.sources.append("\n".join([f"def {function}(p, i, n):", *body, "    return i"]))
        return [f"{pad}i = {function}(p, i, n)"]


class _Unsupported(Exception):
    pass


def compile_check(schema: Any) -> Callable[[bytes], bool] | None:
    """A function telling whether a payload is exactly one datum of `schema` (Apache Avro's parsed
    schema), or None when the schema uses what it does not check (logical types)."""
    gen = _Gen()
    try:
        body = gen.code(schema, "        ")
    except (_Unsupported, AttributeError, ValueError, TypeError):
        return None
    check = "\n".join(
        [
            "def check(p):",
            "    n = len(p)",
            "    i = 0",
            "    try:",
            *body,
            "    except _ERRORS:",
            "        return False",
            "    return i == n",
        ]
    )
    namespace: dict[str, Any] = {
        "_Bad": _Bad,
        "_ERRORS": _ERRORS,
        "_long": _long,
        "_skip_long": _skip_long,
        "_int": _int,
    }
    # The source is generated from the schema's structure only (type kinds, sizes, counts): no name or
    # other text of the schema reaches it.
    exec(compile("\n\n".join([*gen.sources, check]), "<avro check>", "exec"), namespace)
    result: Callable[[bytes], bool] = namespace["check"]
    return result
