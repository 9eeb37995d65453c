"""`ister admin topics recover` (IsterAdmin.RecoverTopic; docs/replication.md, "Unclean recovery"): restart a
replicated topic whose in-sync replicas are all gone, with the data loss said in numbers. Without
`--accept-data-loss` it only says what it would do."""

from __future__ import annotations

from typing import Annotated

import typer

from ister.cli.admin import (
    DEFAULT_ADMIN_ADDR,
    AdminAddr,
    Output,
    OutputOpt,
    TopicArg,
    call,
    emit_fields,
    emit_json,
    topic_name,
    topics_app,
)
from ister.wire.gen import ister_v1_pb2 as ister_pb

RECOVER_TIMEOUT_SECONDS = 60.0  # the broker waits up to 30 s for the new leader


@topics_app.command("recover")
def topics_recover(
    topic: TopicArg,
    accept_data_loss: Annotated[
        bool,
        typer.Option(
            "--accept-data-loss",
            help="do it: acknowledged records that no surviving copy or the durable tier holds are gone",
        ),
    ] = False,
    admin_addr: AdminAddr = DEFAULT_ADMIN_ADDR,
    output: OutputOpt = Output.table,
) -> None:
    """Unclean recovery (Kafka's unclean leader election, without reusing offsets): a replicated topic
    whose in-sync replicas are all gone restarts on the longest surviving copy and the durable tier. New
    offsets start after every offset its last leader handed out. Refused while an in-sync replica lives."""
    request = ister_pb.RecoverTopicRequest(topic=topic_name(topic), accept_data_loss=accept_data_loss)
    r = call(admin_addr, lambda s: s.ister_admin.RecoverTopic(request, timeout=RECOVER_TIMEOUT_SECONDS))
    gone = max(0, r.resume_at - r.kept_end)
    certain = max(0, r.acked_end - r.kept_end)
    if output == Output.json:
        emit_json(
            {
                "topic": r.topic,
                "leader": str(r.leader),
                "epoch": str(r.epoch),
                "kept_end": r.kept_end,
                "resume_at": r.resume_at,
                "acked_end": r.acked_end,
                "gone": [r.kept_end, r.resume_at] if gone else None,
                "survivors": [str(b) for b in r.survivors],
            }
        )
        return
    emit_fields(
        [
            ("Topic", r.topic),
            ("Leader", f"{r.leader} (epoch {r.epoch})"),
            ("Survivors compared", ", ".join(str(b) for b in r.survivors) or "(none: the durable tier only)"),
            ("Kept", f"offsets below {r.kept_end}"),
            (
                "Gone",
                f"offsets {r.kept_end}..{r.resume_at - 1} ({gone}; {certain} acknowledged for certain)"
                if gone
                else "nothing",
            ),
            ("New offsets from", str(r.resume_at)),
        ]
    )
