"""`ister pipeline export`: topics → a Parquet table (by topic and date), exactly once, on Spark."""

from __future__ import annotations

from typing import Annotated

import typer

from ister.cli.main import app
from ister.errors import IsterError
from ister.ids import counted

pipeline_app = typer.Typer(
    help="Data pipelines on Spark (needs the spark extra: pip install 'ister\\[spark]')."
)
app.add_typer(pipeline_app, name="pipeline")


@pipeline_app.command("export")
def export(
    topic: Annotated[list[str], typer.Option("--topic", "-t", help="a topic to export (repeat for more)")],
    to: Annotated[str, typer.Option("--to", help="the table directory (or a URL Spark can write)")],
    service_addr: Annotated[
        str | None,
        typer.Option("--service-addr", "-s", help="a broker, e.g. http://127.0.0.1:6650 (required)"),
    ] = None,
    service_url: Annotated[str | None, typer.Option("--service-url", hidden=True)] = None,  # the old name
    format: Annotated[str, typer.Option("--format", help="Spark file format of the table")] = "parquet",
    trigger: Annotated[
        str,
        typer.Option("--trigger", help="availableNow: export what is there, then stop; interval: keep going"),
    ] = "availableNow",
    interval: Annotated[
        str, typer.Option("--interval", help="micro-batch interval for --trigger interval")
    ] = ("10 seconds"),
    checkpoint: Annotated[
        str | None, typer.Option("--checkpoint", help="checkpoint directory (default <to>/_ister_checkpoint)")
    ] = None,
    starting_offsets: Annotated[
        str, typer.Option("--starting-offsets", help="earliest, latest or JSON; first run only")
    ] = "earliest",
    max_offsets_per_trigger: Annotated[
        int | None, typer.Option("--max-offsets-per-trigger", help="cap per micro-batch")
    ] = None,
    lag_subscription: Annotated[
        str | None,
        typer.Option("--lag-subscription", help="a subscription whose cursor follows the job (lag)"),
    ] = None,
    master: Annotated[str, typer.Option("--master", help="Spark master")] = "local[*]",
) -> None:
    """Write topics to a table partitioned by topic and date, exactly once: a Structured Streaming query
    from the `ister` source whose batches are written aside and moved into the table once complete, so
    DuckDB or pyarrow see committed files only. Run it again (same --to and --checkpoint) to continue
    where it stopped; a crashed run is repaired first."""
    service_addr = service_addr or service_url
    if not service_addr:
        raise typer.BadParameter("give the broker to read from", param_hint="'--service-addr' / '-s'")
    try:
        from ister.spark.pipeline import ExportJob, local_session
    except ImportError as exc:
        typer.echo(f"error: the spark extra is missing ({exc}); pip install 'ister[spark]'", err=True)
        raise typer.Exit(2) from None
    try:
        job = ExportJob(
            service_url=service_addr if "://" in service_addr else f"http://{service_addr}",
            topics=topic,
            path=to,
            format=format,
            trigger=trigger,
            interval=interval,
            checkpoint=checkpoint,
            starting_offsets=starting_offsets,
            max_offsets_per_trigger=max_offsets_per_trigger,
            lag_subscription=lag_subscription,
        )
    except IsterError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    spark = local_session(master)
    try:
        try:
            query = job.start(spark)
        except IsterError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        try:
            query.awaitTermination()
        except KeyboardInterrupt:
            query.stop()
        progress = query.recentProgress
        rows = sum(p["numInputRows"] for p in progress)
        typer.echo(f"exported {counted(rows, 'row')} in {counted(len(progress), 'batch', 'batches')} to {to}")
    finally:
        spark.stop()
