"""Certificates (trustme), JWT secrets and tokens for the security tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import trustme

from ister.security.tokens import mint


@dataclass
class Pki:
    ca: trustme.CA
    dir: Path
    ca_file: Path
    cert_file: Path
    key_file: Path

    def issue(self, name: str, *hosts: str) -> tuple[Path, Path]:
        """A leaf certificate signed by this CA: (cert chain file, key file)."""
        cert = self.ca.issue_cert(*hosts) if hosts else self.ca.issue_cert(name)
        chain = self.dir / f"{name}.pem"
        key = self.dir / f"{name}.key"
        chain.write_bytes(b"".join(b.bytes() for b in cert.cert_chain_pems))
        key.write_bytes(cert.private_key_pem.bytes())
        return chain, key

    def client(self, principal: str) -> tuple[Path, Path]:
        cert = self.ca.issue_cert(f"{principal}@clients.test", common_name=principal)
        chain = self.dir / f"client-{principal}.pem"
        key = self.dir / f"client-{principal}.key"
        chain.write_bytes(b"".join(b.bytes() for b in cert.cert_chain_pems))
        key.write_bytes(cert.private_key_pem.bytes())
        return chain, key


def make_pki(directory: Path, name: str = "broker") -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    ca_file = directory / f"{name}-ca.pem"
    ca_file.write_bytes(ca.cert_pem.bytes())
    pki = Pki(ca, directory, ca_file, directory / "x", directory / "x")
    pki.cert_file, pki.key_file = pki.issue(name, "127.0.0.1", "localhost")
    return pki


SECRET = b"test-secret-0123456789abcdef-0123456789"


def secret_file(directory: Path) -> Path:
    path = directory / "jwt.secret"
    path.write_bytes(SECRET + b"\n")
    return path


def token(principal: str, ttl: int = 3600, **kw: object) -> str:
    return mint(SECRET, principal, ttl, **kw)  # type: ignore[arg-type]
