"""Batch-API publish, plaintext vs TLS + JWT authentication + RBAC (docs/benchmarks.md, Security).

Run: PYTHONPATH=src python bench/security_cost.py [MESSAGES]  (3 alternating rounds per mode)."""

import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path

import trustme

from ister.benchmark import ister_cases
from ister.benchmark.broker import BenchBroker
from ister.security.tokens import mint

N = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
d = Path(tempfile.mkdtemp())
ca = trustme.CA()
cert = ca.issue_cert("127.0.0.1")
(d / "ca.pem").write_bytes(ca.cert_pem.bytes())
(d / "c.pem").write_bytes(cert.cert_chain_pems[0].bytes())
(d / "k.pem").write_bytes(cert.private_key_pem.bytes())
secret = b"bench-secret-0123456789abcdef"
(d / "s").write_bytes(secret)
secure_env = {
    "ISTER_SECURITY__TLS__CERT_FILE": str(d / "c.pem"),
    "ISTER_SECURITY__TLS__KEY_FILE": str(d / "k.pem"),
    "ISTER_SECURITY__AUTH__JWT__SECRET_FILE": str(d / "s"),
    "ISTER_SECURITY__SUPERUSERS": "[bench]",
}
res = {}
for rnd in range(3):
    for mode in ("plain", "secure"):
        env = secure_env if mode == "secure" else {}
        with BenchBroker(env=env) as b:
            url = b.url
            if mode == "secure":
                os.environ["ISTER_TOKEN"] = mint(secret, "bench", 3600)
                os.environ["ISTER_TLS_CA"] = str(d / "ca.pem")
                url = url.replace("http://", "https://")
            else:
                os.environ.pop("ISTER_TOKEN", None)
                os.environ.pop("ISTER_TLS_CA", None)
            r = asyncio.run(ister_cases.publish(url, f"/default/b{rnd}", N))
            rate = r.get("msgs_per_s") or r
            res.setdefault(mode, []).append(rate)
            print(mode, rnd, {k: v for k, v in r.items() if not isinstance(v, (list, dict))}, flush=True)
print(json.dumps(res))
