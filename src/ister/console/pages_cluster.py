"""Broker drain and activate (behind a confirmation) and the rebalancing page.

Drain is BrokerAdmin.UnloadBroker and activate ActivateBroker, the calls `ister admin brokers drain` and
`activate` make. The confirmation page shows the drain's dry run (how many topics would move). The broker
decides RBAC: its PERMISSION_DENIED is the 403 page. The rebalancing page shows the balance and the moves a
rebalancing check would make now, with their reasons (TriggerRebalance with dry_run, which moves nothing),
and from GetClusterHealth the moves made recently with their reasons and the moves that failed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import grpc
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ister.console.health import health
from ister.console.pagekit import Render, rpc_error
from ister.console.source import CALL_TIMEOUT_SECONDS, AdminSource
from ister.wire.gen import DanubeAdmin_pb2 as pb

Handler = Callable[[Request], Awaitable[Response]]
ACTIONS = ("drain", "activate")
MOVES_SHOWN = 50  # the rebalancing page's recent moves (the history keeps about 2 hours)


def _broker_action(source: AdminSource, render: Render) -> Handler:
    async def action(request: Request) -> Response:
        broker, verb = request.path_params["broker"], request.path_params["verb"]
        if not broker.isascii() or not broker.isdigit() or verb not in ACTIONS:
            return render("error.html", 404, message="no such page: a broker id is a number", nav="overview")
        ctx = {"broker": broker, "verb": verb, "nav": "overview"}
        try:
            if request.method == "GET":
                plan = None
                if verb == "drain":  # the dry run: how many topics would move (and RBAC's answer)
                    plan = await source.brokers.UnloadBroker(
                        pb.UnloadBrokerRequest(broker_id=broker, dry_run=True), timeout=CALL_TIMEOUT_SECONDS
                    )
                return render("broker_action.html", plan=plan, done=None, **ctx)
            form = await request.form()
            if form.get("confirm") != "yes":
                return render("error.html", 400, message="not confirmed: nothing was done", nav="overview")
            if verb == "drain":
                done = await source.brokers.UnloadBroker(
                    pb.UnloadBrokerRequest(broker_id=broker), timeout=CALL_TIMEOUT_SECONDS
                )
                message = f"Broker {broker} is draining: {done.total} topic(s) to move away."
            else:
                await source.brokers.ActivateBroker(
                    pb.ActivateBrokerRequest(broker_id=broker, reason="console_activate"),
                    timeout=CALL_TIMEOUT_SECONDS,
                )
                message = f"Broker {broker} is active again."
        except grpc.RpcError as exc:
            return rpc_error(render, exc, "overview", f"{verb} broker {broker}")
        return render("broker_action.html", plan=None, done=message, **ctx)

    return action


def _rebalancing(source: AdminSource, render: Render) -> Handler:
    async def rebalancing(request: Request) -> Response:
        try:
            balance = await source.brokers.GetClusterBalance(
                pb.ClusterBalanceRequest(), timeout=CALL_TIMEOUT_SECONDS
            )
            plan = await source.brokers.TriggerRebalance(
                pb.RebalanceRequest(dry_run=True), timeout=CALL_TIMEOUT_SECONDS
            )
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:
                return rpc_error(render, exc, "rebalancing", "rebalancing")
            balance, plan, note = None, None, exc.details()  # standalone: nothing to balance
        else:
            note = ""
        h = await health(source.ister_admin, MOVES_SHOWN)
        return render("rebalancing.html", balance=balance, plan=plan, note=note, h=h, nav="rebalancing")

    return rebalancing


def routes(source: AdminSource, render: Render) -> list[Route]:
    return [
        Route("/brokers/{broker}/{verb}", _broker_action(source, render), methods=["GET", "POST"]),
        Route("/rebalancing", _rebalancing(source, render)),
    ]
