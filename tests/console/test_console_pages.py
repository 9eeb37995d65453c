"""The console's schemas, security and rebalancing pages and the overview's rates against a real standalone
broker and a real `ister console` process (HTTP level), and every one of them while the admin API is down."""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
from collections.abc import Iterator

import grpc
import pytest

from ister.wire.gen import DanubeAdmin_pb2 as apb
from ister.wire.gen import DanubeAdmin_pb2_grpc as apb_grpc
from ister.wire.gen import SchemaRegistry_pb2 as spb
from ister.wire.gen import SchemaRegistry_pb2_grpc as spb_grpc
from tests.console.console_support import console, get, post
from tests.integration.harness import BrokerProcess
from tests.support import until_sync

pytestmark = [pytest.mark.integration]

V1 = {"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"}]}
V2 = {
    "type": "record",
    "name": "Order",
    "fields": [{"name": "id", "type": "long"}, {"name": "note", "type": "string", "default": ""}],
}
# A new required field without a default: old records cannot be read with it (not backward compatible).
BREAKING = {
    "type": "record",
    "name": "Order",
    "fields": [{"name": "id", "type": "long"}, {"name": "total", "type": "double"}],
}


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, str]]:
    broker = BrokerProcess(tmp_path_factory.mktemp("pages") / "data")
    broker.start()
    with grpc.insecure_channel(broker.admin_addr) as channel:
        reg = spb_grpc.SchemaRegistryStub(channel)
        for schema in (V1, V2):
            reg.RegisterSchema(
                spb.RegisterSchemaRequest(
                    subject="orders-value", schema_type="avro", schema_definition=json.dumps(schema).encode()
                ),
                timeout=10,
            )
        sec = apb_grpc.SecurityAdminStub(channel)
        role = apb.RoleDefinition(name="auditor", permissions=["ReadSchema"])
        sec.CreateRole(apb.CreateRoleRequest(role=role), timeout=10)
        binding = apb.BindingDefinition(
            id="audit-team",
            principal_type="user",
            principal_name="alice",
            role_names=["auditor"],
            scope="cluster",
            resource_name="",
        )
        sec.CreateBinding(apb.CreateBindingRequest(binding=binding), timeout=10)
    try:
        with console(broker.admin_addr) as base:
            yield broker, base
    finally:
        broker.stop()


def test_every_page_has_a_title_language_and_the_nav(setup: tuple[BrokerProcess, str]) -> None:
    _, base = setup
    for path, nav in (("/schemas", "Schemas"), ("/security", "Security"), ("/rebalancing", "Rebalancing")):
        status, body = get(base + path)
        assert status == 200, body
        assert '<html lang="en">' in body and "<h1>" in body
        assert re.search(rf'<a href="{path}" aria-current="page">{nav}</a>', body), body


def test_overview_shows_dispatch_rates_and_says_why_publish_rates_are_missing(
    setup: tuple[BrokerProcess, str],
) -> None:
    _, base = setup
    status, body = get(base + "/")
    assert status == 200
    assert '<dd id="rate-dispatch">0.0</dd>' in body and '<dd id="total-lagging">0</dd>' in body
    # A standalone broker writes no load reports: the figure is a dash and a note says why.
    assert '<dd id="rate-publish">—</dd>' in body
    assert "no load reports (publish rates)" in html.unescape(body)
    assert 'class="drain"' not in body  # a drain needs another active broker


def test_schemas_list_versions_diff_and_mode(setup: tuple[BrokerProcess, str]) -> None:
    _, base = setup
    status, body = get(base + "/schemas")
    assert status == 200
    assert re.search(r'data-subject="orders-value">.*?<td>avro</td><td class="num">2</td>', body, re.S), body
    status, body = get(base + "/schemas/orders-value")
    assert status == 200
    assert '<dd id="latest-version">2</dd>' in body and 'id="compatibility">' in body
    diff = re.search(r'<pre class="diff" id="diff">(.*?)</pre>', body, re.S)
    assert diff is not None
    added = re.findall(r'<span class="add">(.*?)</span>', diff.group(1))
    assert any('"name": "note"' in html.unescape(a) for a in added), added
    assert '<span class="del">' not in diff.group(1)  # v2 only added a field
    status, body = get(base + "/schemas/orders-value?a=1&b=1")
    assert status == 200 and 'id="no-diff"' in body
    assert get(base + "/schemas/orders-value?a=9")[0] == 404
    assert get(base + "/schemas/orders-value?a=x")[0] == 400
    assert get(base + "/schemas/no-such-subject")[0] == 404


def test_a_draft_is_checked_and_nothing_is_registered(setup: tuple[BrokerProcess, str]) -> None:
    _, base = setup
    url = base + "/schemas/orders-value"
    compatible = {**V2, "fields": [*V2["fields"], {"name": "tag", "type": "string", "default": "x"}]}
    status, body = post(url, {"draft": json.dumps(compatible)})
    assert status == 200 and 'id="draft-ok"' in body, body
    status, body = post(url, {"draft": json.dumps(BREAKING)})
    assert status == 200 and 'id="draft-bad"' in body, body
    status, body = post(url, {"draft": "   "})
    assert status == 400 and 'id="draft-error"' in body
    assert '<dd id="latest-version">2</dd>' in get(url)[1]  # neither draft was registered


def test_security_lists_roles_and_bindings(setup: tuple[BrokerProcess, str]) -> None:
    _, base = setup
    status, body = get(base + "/security")
    assert status == 200
    assert re.search(r'data-role="auditor"><td>auditor</td><td>ReadSchema</td><td>defined</td><td>yes', body)
    assert re.search(r'data-binding="audit-team">.*?user:alice</td><td>auditor</td><td>cluster', body, re.S)


def test_rebalancing_on_a_standalone_broker_says_there_is_nothing_to_balance(
    setup: tuple[BrokerProcess, str],
) -> None:
    _, base = setup
    status, body = get(base + "/rebalancing")
    assert status == 200 and 'id="standalone"' in body
    # The cluster's health answers for one broker: nothing moves or is replicated, and it says so.
    assert 'id="health-note"' in body and "cluster mode only" in body and 'id="recent-moves"' not in body
    overview = get(base + "/fragments/overview")[1]
    assert 'id="health-note"' in overview and "cluster mode only" in overview
    assert get(base + "/brokers/0/drain")[0] == 409  # standalone: FAILED_PRECONDITION, in words
    assert get(base + "/brokers/x/drain")[0] == 404


def cli(admin_addr: str, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "ister.cli", "admin", *args, "--admin-addr", admin_addr]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def test_cluster_health_command_on_a_standalone_broker(setup: tuple[BrokerProcess, str]) -> None:
    broker, _ = setup
    table = cli(broker.admin_addr, "cluster", "health")
    assert table.returncode == 0 and table.stdout.startswith("standalone: ")
    assert "cluster mode only" in table.stdout
    answer = json.loads(cli(broker.admin_addr, "cluster", "health", "-o", "json").stdout)
    assert answer["mode"] == "standalone" and answer["replicated_topics"] == 0
    for listed in ("moves", "failed_moves", "under_replicated", "under_min_isr"):
        assert answer[listed] == []


def test_every_new_page_shows_the_unreachable_banner_while_the_broker_is_down(
    setup: tuple[BrokerProcess, str],
) -> None:
    broker, base = setup
    broker.stop()
    try:
        for path in ("/schemas", "/schemas/orders-value", "/security", "/rebalancing", "/brokers/1/drain"):
            status, body = get(base + path)
            assert status == 503 and 'id="unreachable"' in body, (path, body)
        status, body = post(base + "/schemas/orders-value", {"draft": "{}"})
        assert status == 503 and 'id="unreachable"' in body
        status, body = post(base + "/brokers/1/activate", {"confirm": "yes"})
        assert status == 503 and 'id="unreachable"' in body
        until_sync(lambda: 'id="unreachable"' in get(base + "/fragments/overview")[1], "the banner")
        down = cli(broker.admin_addr, "cluster", "health")  # the command line: one line, no traceback
        assert down.returncode == 1 and down.stderr.startswith("error:") and "Traceback" not in down.stderr
    finally:
        broker.start()
    until_sync(lambda: get(base + "/schemas")[0] == 200, "the schemas page after the restart")
