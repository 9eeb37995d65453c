"""JWT validation (HS256, RS256, ES256, JWKS; exp, nbf, iss, aud), RBAC decisions and audit rate limit."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from ister.config import JwtSettings
from ister.errors import InvalidArgument, Unauthenticated
from ister.security.audit import AuditLog
from ister.security.rbac import Binding, Policy, Resource, Role, check_binding, topic_resource
from ister.security.tokens import Principal, TokenVerifier, mint, parse_ttl

SECRET = b"unit-secret-0123456789abcdef"


def _pem(key: object) -> bytes:
    return key.public_key().public_bytes(  # type: ignore[attr-defined]
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def test_hs256_tokens_and_claim_checks(tmp_path: Path) -> None:
    (tmp_path / "s").write_bytes(SECRET)
    v = TokenVerifier(JwtSettings(secret_file=str(tmp_path / "s"), issuer="danube-auth", audience="ister"))
    assert v.verify(mint(SECRET, "app", 60, audience="ister")) == Principal("service_account", "app", "jwt")
    cases = {
        "expired": mint(SECRET, "app", 1, audience="ister", now=time.time() - 3600),
        "not valid yet": jwt.encode(
            {
                "sub": "a",
                "exp": time.time() + 9999,
                "nbf": time.time() + 3600,
                "iss": "danube-auth",
                "aud": "ister",
            },
            SECRET,
        ),
        "issuer": mint(SECRET, "app", 60, issuer="evil", audience="ister"),
        "audience": mint(SECRET, "app", 60, audience="other"),
        "signature": mint(b"x" * 32, "app", 60, audience="ister"),
        "'exp' is missing": jwt.encode({"sub": "a", "iss": "danube-auth", "aud": "ister"}, SECRET),
        "algorithm": jwt.encode({"sub": "a"}, None, algorithm="none"),
    }
    for why, tok in cases.items():
        with pytest.raises(Unauthenticated, match=why):
            v.verify(tok)


def test_rs256_es256_and_jwks(tmp_path: Path) -> None:
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    (tmp_path / "rsa.pem").write_bytes(_pem(rsa_key))
    v = TokenVerifier(JwtSettings(public_key_files=[str(tmp_path / "rsa.pem")]))
    claims = {"sub": "svc", "principal_type": "user", "exp": int(time.time()) + 60}
    assert v.verify(jwt.encode(claims, rsa_key, algorithm="RS256")).name == "svc"
    with pytest.raises(Unauthenticated, match="no ES256 key"):
        v.verify(jwt.encode(claims, ec_key, algorithm="ES256"))
    jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(ec_key.public_key()))
    jwk["kid"] = "k1"
    (tmp_path / "jwks.json").write_text(json.dumps({"keys": [jwk]}))
    v = TokenVerifier(JwtSettings(jwks_file=str(tmp_path / "jwks.json")))
    tok = jwt.encode(claims, ec_key, algorithm="ES256", headers={"kid": "k1"})
    assert v.verify(tok) == Principal("user", "svc", "jwt")


def test_policy_default_deny_patterns_and_superusers() -> None:
    p = Policy(
        superusers=frozenset({"root"}),
        roles={"rw": Role("rw", ("Produce", "Consume")), "schemas": Role("schemas", ("ManageSchema",))},
        bindings=[
            Binding("b1", "service_account", "app", ("rw",), "topic", "/default/orders-*"),
            Binding("b2", "*", "ops", ("schemas",), "cluster"),
            Binding("b3", "user", "ann", ("rw", "missing"), "namespace", "team-*"),
        ],
    )
    app = Principal("service_account", "app", "jwt")
    assert p.allows(app, "Produce", topic_resource("/default/orders-eu"))
    assert p.allows(app, "Produce", topic_resource("/default/orders-eu-part-3"))
    assert not p.allows(app, "Produce", topic_resource("/default/payments"))
    assert not p.allows(app, "Lookup", topic_resource("/default/orders-eu"))
    assert not p.allows(Principal("user", "app", "jwt"), "Produce", topic_resource("/default/orders-eu"))
    assert p.allows(Principal("user", "ops", "mtls"), "ReadSchema", Resource("cluster"))  # implied
    assert p.allows(Principal("user", "ann", "jwt"), "Consume", topic_resource("/team-a/t"))
    assert not p.allows(Principal("user", "ann", "jwt"), "Consume", topic_resource("/default/t"))
    assert p.allows(Principal("user", "root", "jwt"), "ManageCluster", Resource("cluster"))
    with pytest.raises(InvalidArgument):
        check_binding(Binding("b", "service_account", "x", ("r",), "topic", "no-namespace"))


def test_audit_is_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    audit = AuditLog(max_per_second=3, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="ister.audit"):
        for i in range(10):
            audit.record("service_account:a", "TopicAdmin.DeleteTopic", "topic:/default/t", f"denied {i}")
        now[0] += 1
        audit.record("service_account:a", "TopicAdmin.DeleteTopic", "topic:/default/t", "ok")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4
    assert lines[-1].endswith("result=ok dropped_before=7")


def test_parse_ttl() -> None:
    assert [parse_ttl(x) for x in ("90", "90s", "15m", "1h", "2d")] == [90, 90, 900, 3600, 172800]
    with pytest.raises(InvalidArgument):
        parse_ttl("soon")
