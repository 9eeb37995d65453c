"""`ister admin topics ...`: a subscription's settings, the failure policy (set-failure-policy,
get-failure-policy) and the dispatch config (set-dispatch-config, get-dispatch-config). Each command builds a
spec (`admin_spec.py`); they register after the other topic commands (admin_topics.py imports this)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

import typer

from ister.cli.admin import (
    DEFAULT_ADMIN_ADDR,
    AdminAddr,
    Output,
    OutputOpt,
    SubscriptionOpt,
    TopicArg,
    topic_name,
    topics_app,
)
from ister.cli.admin_show import emit_fields
from ister.cli.admin_spec import Spec, admin_command, done, rpc
from ister.wire.gen import DanubeAdmin_pb2 as pb


class Backoff(StrEnum):
    fixed = "fixed"
    exponential = "exponential"


class Poison(StrEnum):
    dead_letter = "dead_letter"
    block = "block"
    drop = "drop"


_BACKOFF = {Backoff.fixed: pb.Fixed, Backoff.exponential: pb.Exponential}
_POISON = {Poison.dead_letter: pb.DeadLetter, Poison.block: pb.Block, Poison.drop: pb.Drop}
_BACKOFF_NAMES = {pb.Fixed: "Fixed", pb.Exponential: "Exponential"}
_POISON_NAMES = {pb.DeadLetter: "DeadLetter", pb.Block: "Block", pb.Drop: "Drop"}


@admin_command(topics_app, "set-failure-policy")
def topics_set_failure_policy(
    topic: TopicArg,
    subscription: SubscriptionOpt,
    max_redelivery_count: Annotated[int, typer.Option("--max-redelivery-count", min=0)],
    ack_timeout_ms: Annotated[int, typer.Option("--ack-timeout-ms", min=1)],
    base_redelivery_delay_ms: Annotated[int, typer.Option("--base-redelivery-delay-ms", min=0)],
    max_redelivery_delay_ms: Annotated[int, typer.Option("--max-redelivery-delay-ms", min=0)],
    poison_policy: Annotated[Poison, typer.Option("--poison-policy")],
    backoff_strategy: Annotated[Backoff, typer.Option("--backoff-strategy")] = Backoff.fixed,
    dead_letter_topic: Annotated[str | None, typer.Option("--dead-letter-topic")] = None,
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> Spec[Any]:
    """Store a Reliable subscription's failure policy (used when the subscription next opens)."""
    name = topic_name(topic)
    policy = pb.SubscriptionFailurePolicy(
        max_redelivery_count=max_redelivery_count,
        ack_timeout_ms=ack_timeout_ms,
        base_redelivery_delay_ms=base_redelivery_delay_ms,
        max_redelivery_delay_ms=max_redelivery_delay_ms,
        backoff_strategy=_BACKOFF[backoff_strategy],
        poison_policy=_POISON[poison_policy],
    )
    if dead_letter_topic is not None:
        policy.dead_letter_topic = topic_name(dead_letter_topic)
    request = pb.SetSubscriptionFailurePolicyRequest(
        topic=name, subscription=subscription, failure_policy=policy
    )
    return done(
        rpc("topics", "SetSubscriptionFailurePolicy", request),
        f"stored the failure policy of {subscription} on {name}",
        topic=name,
        subscription=subscription,
    )


def _failure_policy(response: Any) -> dict[str, Any] | None:
    if not response.HasField("failure_policy"):
        return None
    p = response.failure_policy
    return {
        "max_redelivery_count": p.max_redelivery_count,
        "ack_timeout_ms": p.ack_timeout_ms,
        "base_redelivery_delay_ms": p.base_redelivery_delay_ms,
        "max_redelivery_delay_ms": p.max_redelivery_delay_ms,
        "backoff_strategy": _BACKOFF_NAMES.get(p.backoff_strategy, str(p.backoff_strategy)),
        "dead_letter_topic": p.dead_letter_topic if p.HasField("dead_letter_topic") else None,
        "poison_policy": _POISON_NAMES.get(p.poison_policy, str(p.poison_policy)),
    }


def _failure_policy_table(response: Any) -> None:
    policy = _failure_policy(response)
    fields = [("Subscription type", str(response.subscription_type))]
    if policy is None:
        fields.append(("Failure policy", "(not set: the broker's defaults apply)"))
    else:
        fields.extend((k, "-" if v is None else str(v)) for k, v in policy.items())
    emit_fields(fields)


@admin_command(topics_app, "get-failure-policy")
def topics_get_failure_policy(
    topic: TopicArg,
    subscription: SubscriptionOpt,
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> Spec[Any]:
    """A subscription's stored failure policy and type."""
    request = pb.GetSubscriptionFailurePolicyRequest(topic=topic_name(topic), subscription=subscription)
    return Spec(
        rpc("topics", "GetSubscriptionFailurePolicy", request),
        _failure_policy_table,
        lambda r: {"subscription_type": r.subscription_type, "failure_policy": _failure_policy(r)},
    )


@admin_command(topics_app, "set-dispatch-config")
def topics_set_dispatch_config(
    topic: TopicArg,
    subscription: SubscriptionOpt,
    max_unacked_messages: Annotated[int | None, typer.Option("--max-unacked-messages", min=0)] = None,
    rebalance_delay: Annotated[
        float | None, typer.Option("--rebalance-delay", min=0.0, help="seconds (Failover, partitioned)")
    ] = None,
    max_handoff: Annotated[
        float | None, typer.Option("--max-handoff", min=0.0, help="seconds (Failover, partitioned)")
    ] = None,
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> Spec[Any]:
    """Set a Reliable subscription's window (1..10000 unacknowledged messages) and, for a Failover
    subscription on a partitioned topic (a base name sets every partition), its rebalance delay and
    handoff time. Settings not given stay as they are."""
    name = topic_name(topic)
    config = pb.SubscriptionDispatchConfig(max_unacked_messages=max_unacked_messages or 0)
    if rebalance_delay is not None:
        config.rebalance_delay_seconds = rebalance_delay
    if max_handoff is not None:
        config.max_handoff_seconds = max_handoff
    request = pb.SetSubscriptionDispatchConfigRequest(
        topic=name, subscription=subscription, dispatch_config=config
    )
    settings = {
        k: v
        for k, v in (
            ("max_unacked_messages", max_unacked_messages),
            ("rebalance_delay_seconds", rebalance_delay),
            ("max_handoff_seconds", max_handoff),
        )
        if v is not None
    }
    shown_settings = ", ".join(f"{k}={v}" for k, v in settings.items())
    return done(
        rpc("topics", "SetSubscriptionDispatchConfig", request),
        f"set {shown_settings} for {subscription} on {name}",
        topic=name,
        subscription=subscription,
        **settings,
    )


def _dispatch_config(response: Any) -> dict[str, Any]:
    c = response.dispatch_config if response.HasField("dispatch_config") else None
    return {
        "max_unacked_messages": (c.max_unacked_messages or None) if c is not None else None,
        "rebalance_delay_seconds": c.rebalance_delay_seconds
        if c is not None and c.HasField("rebalance_delay_seconds")
        else None,
        "max_handoff_seconds": c.max_handoff_seconds
        if c is not None and c.HasField("max_handoff_seconds")
        else None,
    }


@admin_command(topics_app, "get-dispatch-config")
def topics_get_dispatch_config(
    topic: TopicArg,
    subscription: SubscriptionOpt,
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> Spec[Any]:
    """A subscription's stored dispatch settings, if any were set."""
    request = pb.GetSubscriptionDispatchConfigRequest(topic=topic_name(topic), subscription=subscription)
    return Spec(
        rpc("topics", "GetSubscriptionDispatchConfig", request),
        lambda r: emit_fields(
            [
                (k, "(not set: the broker's default applies)" if v is None else str(v))
                for k, v in _dispatch_config(r).items()
            ]
        ),
        _dispatch_config,
    )
