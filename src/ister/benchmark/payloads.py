"""Generated payloads for benchmarks and tests: JSON log lines of about 1 KiB (what compression is for)
and random bytes (what it cannot shrink)."""

from __future__ import annotations

import json
import random


def log_lines(n: int, seed: int = 7) -> list[bytes]:
    """`n` JSON log lines of about 1 KiB, as a service writes them (repetitive keys, varying values)."""
    rnd = random.Random(seed)
    paths = ["/api/v1/orders", "/api/v1/items", "/healthz", "/api/v2/users/search", "/login"]
    out = []
    for i in range(n):
        line: dict[str, object] = {
            "ts": f"2026-12-06T03:{i % 60:02d}:{rnd.randrange(60):02d}.{rnd.randrange(1000):03d}Z",
            "level": rnd.choice(["info", "info", "info", "warn", "error"]),
            "service": "checkout",
            "host": f"web-{rnd.randrange(12):02d}.eu-west-1.internal",
            "trace_id": f"{rnd.getrandbits(128):032x}",
            "method": rnd.choice(["GET", "POST"]),
            "path": rnd.choice(paths),
            "status": rnd.choice([200, 200, 200, 201, 404, 500]),
            "duration_ms": round(rnd.expovariate(1 / 40), 3),
            "user_agent": "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120",
            "msg": "request served",
        }
        detail = ""
        words = ["ok", "cache", "miss", "db", "retry", "user", "order", "item", "timeout", "pool", "shard"]
        while len(text := json.dumps({**line, "detail": detail}).encode()) < 1000:
            detail += f"{rnd.choice(words)}={rnd.randrange(10_000)} "
        out.append(text)
    return out


def random_payloads(n: int, size: int = 1024, seed: int = 7) -> list[bytes]:
    rnd = random.Random(seed)
    return [rnd.randbytes(size) for _ in range(n)]
