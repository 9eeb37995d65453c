"""`ister bench`: the throughput/latency suite (batch API, danube-client, NATS JetStream), table or JSON."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from ister.cli.main import app
from ister.cli.security_opts import TlsCaOpt, TokenOpt, use

CASES = ("publish", "consume", "latency")
IDEMPOTENCE = "idempotence"  # only when asked
COMPRESSION = "compression"  # only when asked: each codec on JSON and random payloads
REPLICATED = "replicated"  # Ister clusters at RF 1 and RF 3 vs NATS JetStream R1 and R3 (issue 16)


@app.command("bench")
def bench(
    json_out: Annotated[bool, typer.Option("--json", help="print the results as one JSON object")] = False,
    no_nats: Annotated[bool, typer.Option("--no-nats", help="skip NATS JetStream")] = False,
    no_danube: Annotated[bool, typer.Option("--no-danube", help="skip the danube-client cases")] = False,
    quick: Annotated[bool, typer.Option("--quick", help="small counts: a smoke run only")] = False,
    fsync: Annotated[str, typer.Option(help="the broker's WAL durability: always or interval")] = "always",
    messages: Annotated[
        int | None, typer.Option("--messages", help="batch-API publish count (default 1,000,000)")
    ] = None,
    nats_script: Annotated[
        Path | None,
        typer.Option("--nats-script", help="the JetStream peer (default ../shared/peers/nats_bench.py)"),
    ] = None,
    cases: Annotated[
        str,
        typer.Option(
            "--cases",
            help="cases to run, comma-separated: publish,consume,latency (one broker) and/or replicated "
            "(3-broker Ister clusters at RF 1 and RF 3 vs 3-node JetStream R3 and 1-node R1) and/or "
            "idempotence (batch publish with idempotence off vs on, 3 runs each; not in the default set) "
            "and/or compression (each codec on 1 KiB JSON and random payloads: ratio, publish and consume; "
            "not in the default set)",
        ),
    ] = ",".join(CASES),
    token: TokenOpt = None,
    tls_ca: TlsCaOpt = None,
) -> None:
    """Run the benchmark suite against fresh broker subprocesses and print the results.

    Batch API: durable publish, consume + ack, e2e latency at 1,000 msg/s.

    danube-client: sequential and 64-in-flight publish, consume + ack, e2e latency, no-op gRPC ceiling.

    NATS JetStream (sync_interval always) in the same run, for the ratios.

    --cases replicated: etcd + 3 cluster brokers at RF 1, then at RF 3 (batch API and danube-client publish
    and e2e latency), then JetStream on 1 node (R1) and on 3 nodes (R3). See docs/benchmarks.md."""
    use(token, tls_ca)
    from ister.benchmark import report, suite

    if fsync not in ("always", "interval"):
        raise typer.BadParameter("--fsync must be always or interval")
    selected = frozenset(c.strip() for c in cases.split(",") if c.strip())
    known = (*CASES, REPLICATED, IDEMPOTENCE, COMPRESSION)
    if not selected or not selected <= set(known):
        raise typer.BadParameter(f"--cases takes a comma-separated subset of {','.join(known)}")
    if messages is not None and messages < 1:
        raise typer.BadParameter("--messages must be positive")
    overrides: dict[str, object] = {
        "fsync": fsync,
        "cases": selected - {REPLICATED},
        "replicated": REPLICATED in selected,
        "danube": not no_danube,
        "nats": not no_nats,
    }
    if messages is not None:
        overrides["messages"] = messages
    if nats_script is not None:
        overrides["nats_script"] = nats_script
    opts = suite.Options.quick_run(**overrides) if quick else suite.Options(**overrides)  # type: ignore[arg-type]

    def progress(msg: str) -> None:
        print(f"ister bench: {msg}", file=sys.stderr, flush=True)

    try:
        result = suite.run(opts, progress)
    except (RuntimeError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    if json_out:
        print(report.to_json(result))
    else:
        report.render(result)
