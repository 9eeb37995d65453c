"""The console with a token whose role may not manage topics (Ister's RBAC has no read-only topic
permission: ManageTopic both reads topic stats and resets cursors): the overview shows the brokers and
says what it may not show; topic pages and the reset are refused by the broker, and the console says so."""

from __future__ import annotations

import os
from collections.abc import Iterator

import grpc
import pytest

from ister.wire.gen import DanubeAdmin_pb2 as apb
from ister.wire.gen import DanubeAdmin_pb2_grpc as apb_grpc
from tests.console.console_support import console, get, post
from tests.integration.harness import BrokerProcess
from tests.integration.security_support import Pki, make_pki, secret_file, token

pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, Pki]]:
    base = tmp_path_factory.mktemp("rbac")
    pki = make_pki(base / "pki")
    broker = BrokerProcess(
        base / "data",
        *("--tls-cert", str(pki.cert_file), "--tls-key", str(pki.key_file)),
        *("--auth-jwt-secret-file", str(secret_file(base)), "--superuser", "root"),
    )
    broker.start()
    md = [("authorization", f"Bearer {token('root')}")]
    with grpc.secure_channel(broker.admin_addr, grpc.ssl_channel_credentials(pki.ca_file.read_bytes())) as ch:
        apb_grpc.TopicAdminStub(ch).CreateTopic(apb.NewTopicRequest(name="/default/guarded"), metadata=md)
        sec = apb_grpc.SecurityAdminStub(ch)
        perms = ["ManageBroker", "ManageNamespace"]
        sec.CreateRole(
            apb.CreateRoleRequest(role=apb.RoleDefinition(name="viewer", permissions=perms)), metadata=md
        )
        binding = apb.BindingDefinition(
            id="viewer-ops",
            principal_type="service_account",
            principal_name="ops",
            role_names=["viewer"],
            scope="cluster",
            resource_name="",
        )
        sec.CreateBinding(apb.CreateBindingRequest(binding=binding), metadata=md)
    try:
        yield broker, pki
    finally:
        broker.stop()


def test_a_token_without_topic_rights_sees_brokers_and_is_refused_the_rest(
    secured: tuple[BrokerProcess, Pki],
) -> None:
    broker, pki = secured
    env = {k: v for k, v in os.environ.items() if k not in ("ISTER_TOKEN", "ISTER_API_KEY")}
    with console(broker.admin_addr, "--token", token("ops"), "--tls-ca", str(pki.ca_file), env=env) as base:
        status, body = get(base + "/")
        assert status == 200 and '<dd id="total-brokers">1</dd>' in body
        assert 'id="denied"' in body and "unreachable" not in body
        status, body = get(base + "/topic/default/guarded")
        assert status == 403 and "PERMISSION_DENIED" in body
        status, body = post(
            base + "/reset/default/guarded", {"subscription": "s", "to": "earliest", "at": ""}
        )
        assert status == 403 and "PERMISSION_DENIED" in body
        status, body = get(base + "/security")  # roles and bindings need ManageCluster
        assert status == 403 and 'id="refused"' in body and "may not read roles and bindings" in body
        status, body = get(base + "/rebalancing")
        assert status == 403 and "PERMISSION_DENIED" in body
    with console(broker.admin_addr, "--token", token("root"), "--tls-ca", str(pki.ca_file), env=env) as base:
        status, body = get(base + "/topic/default/guarded")
        assert status == 200 and '<dd id="end-offset">0</dd>' in body
        status, body = get(base + "/security")
        assert status == 200 and 'data-binding="viewer-ops"' in body and 'data-role="viewer"' in body
