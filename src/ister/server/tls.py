"""TLS for the gRPC ports: server credentials that pick up rewritten certificate files without a restart.

gRPC asks `_Reloader.fetch` at every new TLS handshake; it stats the files (no read unless they changed)
and hands gRPC the new certificate configuration once they did. A half-written pair (the key no longer
matches, a file missing) keeps the previous certificate and logs why. Connections already open keep the
certificate they were set up with.
"""

from __future__ import annotations

import ipaddress
import logging
import ssl
import threading
from typing import TYPE_CHECKING, Any

import grpc

from ister.config import EtcdTlsSettings, TlsFiles, split_host_port
from ister.errors import ConfigError
from ister.security.files import WatchedFiles, read_file

if TYPE_CHECKING:
    from ister.metadata.etcd import EtcdTls

log = logging.getLogger(__name__)


def _check_pair(cert_pem: bytes, key_pem: bytes, what: str) -> None:
    """Refuse a key that is not the certificate's (gRPC would fail every handshake with no reason)."""
    # cryptography is imported only where TLS is configured: it costs ~0.15 s of CPU at every broker start.
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    try:
        cert = x509.load_pem_x509_certificates(cert_pem)[0]
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError, IndexError) as exc:
        raise ConfigError(f"{what}: not a PEM certificate and unencrypted private key: {exc}") from None
    pub = serialization.PublicFormat.SubjectPublicKeyInfo
    enc = serialization.Encoding.DER
    if cert.public_key().public_bytes(enc, pub) != key.public_key().public_bytes(enc, pub):
        raise ConfigError(f"{what}: the private key does not belong to the certificate")


def etcd_tls(settings: EtcdTlsSettings) -> EtcdTls | None:
    """The files of `cluster.etcd_tls`, read and checked (a CA that holds certificates, a key that is the
    certificate's), or None when TLS to etcd is off."""
    from ister.metadata.etcd import EtcdTls  # cluster mode only: standalone brokers never load aetcd

    if not settings.enabled:
        return None
    if not settings.ca_file:
        raise ConfigError("cluster.etcd_tls: ca_file (the CA of etcd's server certificate) is required")
    ca = read_file(settings.ca_file, "cluster.etcd_tls.ca_file")
    from cryptography import x509  # only with TLS to etcd (see _check_pair)

    try:
        x509.load_pem_x509_certificates(ca)
    except ValueError as exc:
        raise ConfigError(
            f"cluster.etcd_tls.ca_file {settings.ca_file}: not a PEM certificate: {exc}"
        ) from None
    if not settings.cert_file or not settings.key_file:
        return EtcdTls(ca)
    cert = read_file(settings.cert_file, "cluster.etcd_tls.cert_file")
    key = read_file(settings.key_file, "cluster.etcd_tls.key_file")
    _check_pair(cert, key, f"cluster.etcd_tls ({settings.cert_file}, {settings.key_file})")
    return EtcdTls(ca, cert, key)


class _Reloader:
    def __init__(self, files: TlsFiles, what: str) -> None:
        assert files.cert_file and files.key_file
        self.what = what
        self.require_client_cert = bool(files.client_ca_file)
        self.watched = WatchedFiles([files.cert_file, files.key_file, files.client_ca_file or ""])
        self._lock = threading.Lock()  # gRPC may call fetch from several of its threads
        self.reloads = 0

    def config(self) -> Any:
        parts = self.watched.read()
        cert, key = parts[0], parts[1]
        _check_pair(cert, key, self.what)
        ca = parts[2] if len(parts) > 2 else None
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def fetch(self) -> Any:
        with self._lock:
            if not self.watched.changed():
                return None
            try:
                config = self.config()
            except ConfigError as exc:
                log.error(
                    "%s: certificate files changed but cannot be used, keeping the old ones: %s",
                    self.what,
                    exc,
                )
                return None
            self.reloads += 1
            log.info("%s: certificate reloaded from %s", self.what, self.watched.paths[0])
            return config


def server_credentials(files: TlsFiles, what: str) -> Any:
    reloader = _Reloader(files, what)
    return grpc.dynamic_ssl_server_credentials(
        reloader.config(), reloader.fetch, require_client_authentication=reloader.require_client_cert
    )


def is_loopback(host: str) -> bool:
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bind(server: Any, addr: str, files: TlsFiles | None, what: str) -> int:
    """Listen on `addr` with TLS (`files`) or plaintext; 0 when the address cannot be bound. Plaintext on
    an address other than loopback is logged as a warning."""
    host, port = split_host_port(addr, what)
    if files is None and not is_loopback(host):
        log.warning(
            "SECURITY WARNING: %s listens on %s WITHOUT TLS: anyone who can reach it can read and change "
            "data. Set --tls-cert/--tls-key (security.tls) or bind to 127.0.0.1.",
            what,
            addr,
        )
    try:
        if files is None:
            return int(server.add_insecure_port(f"{host}:{port}"))
        return int(server.add_secure_port(f"{host}:{port}", server_credentials(files, what)))
    except RuntimeError:  # grpc raises RuntimeError when the address is taken
        return 0


class ReloadingSslContext:
    """An `ssl.SSLContext` for a server socket that is not gRPC's (the metrics endpoint): `context()` is
    called at every accept; it stats the files and builds a new context once they changed, keeping the
    old one (and logging why) when the new pair cannot be used."""

    def __init__(self, files: TlsFiles, what: str) -> None:
        assert files.cert_file and files.key_file
        self.what = what
        self.files = files
        self.watched = WatchedFiles([files.cert_file, files.key_file, files.client_ca_file or ""])
        self.reloads = 0
        self._ctx = self._build()

    def _build(self) -> ssl.SSLContext:
        parts = self.watched.read()
        _check_pair(parts[0], parts[1], self.what)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(str(self.files.cert_file), str(self.files.key_file))
            if len(parts) > 2:
                ctx.load_verify_locations(cadata=parts[2].decode("ascii", "replace"))
                ctx.verify_mode = ssl.CERT_REQUIRED
        except (ssl.SSLError, OSError, ValueError) as exc:
            raise ConfigError(f"{self.what}: cannot load the certificate files: {exc}") from None
        return ctx

    def context(self) -> ssl.SSLContext:
        if self.watched.changed():
            try:
                self._ctx = self._build()
            except ConfigError as exc:
                log.error(
                    "%s: certificate files changed but cannot be used, keeping the old ones: %s",
                    self.what,
                    exc,
                )
            else:
                self.reloads += 1
                log.info("%s: certificate reloaded from %s", self.what, self.watched.paths[0])
        return self._ctx
