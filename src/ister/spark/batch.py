"""`ister.spark.read(spark, **options)`: a batch read whose exported history goes through Spark's own
Parquet reader (JVM, no Python worker in the path) and only the rest through the `ister` format.

A Python data source cannot hand Spark a JVM scan, so this runs on the driver, where the SparkSession is:
it plans the query's offset ranges once (the same rules and the same Offsets calls as
`spark.read.format("ister")`), takes the ranges held by checked Parquet copies (docs/formats.md) as
`spark.read.parquet` of those files filtered to the ranges, and hands every other offset to the `ister`
format as exact ranges (`ister.internal.ranges`), then unions the two. Each offset is in exactly one side,
so the rows are the format's rows: same columns, same values, no offset twice or missing.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from functools import reduce
from typing import Any
from urllib.parse import urlsplit

from ister.core.stream_offsets import TopicPartition
from ister.spark.options import RANGES, SourceOptions
from ister.spark.rows import ddl
from ister.spark.source import IsterBatchReader

log = logging.getLogger(__name__)

Span = tuple[int, int]  # [start, end)


def read(spark: Any, options: Mapping[str, str] | None = None, **more: str) -> Any:
    """The DataFrame `spark.read.format("ister").options(**options).load()` gives, with exported history
    read by Spark's Parquet reader where the durable tier has Parquet copies Spark can reach (a `file://`
    tier, or `ister.read.parquetUrl` naming the tier for Hadoop, e.g. `s3a://bucket/prefix`). Falls back to
    the format alone for `valueFormat=schema` (values are decoded in Python), `ister.read.parquet=false`,
    or when no copy can be used."""
    given = {str(k): str(v) for k, v in {**(options or {}), **more}.items()}

    def plain() -> Any:
        return spark.read.format("ister").options(**given).load()

    opts = SourceOptions.parse(given, streaming=False)
    if opts.value.typed or not opts.use_parquet or opts.ranges is not None:
        return plain()
    reader = IsterBatchReader(opts)
    planner = reader.planner
    try:
        ranges = reader.plan()
        whole: list[str] = []  # copies entirely inside the planned range: read as they are
        edges: dict[TopicPartition, list[tuple[str, Span]]] = {}  # copies cut by the range's ends
        covered: dict[TopicPartition, list[Span]] = {}
        for tp, (start, end) in sorted(ranges.items()):
            if start >= end:
                continue
            url, _objects, copies = planner.listing(tp)
            base = _hadoop_base(url, opts.parquet_url)
            if base is None or not copies:
                continue
            wanted = {r: k for r, k in copies.items() if r[1] >= start and r[0] < end}
            for (first, last), key in sorted(_checked(url, opts.storage_options, wanted).items()):
                span = (max(first, start), min(last + 1, end))
                if span == (first, last + 1):
                    whole.append(f"{base}/{key}")
                else:
                    edges.setdefault(tp, []).append((f"{base}/{key}", span))
                covered.setdefault(tp, []).append(span)
    finally:
        planner.close()
    if not covered:
        return plain()
    rest = {tp: _minus(span, covered.get(tp, [])) for tp, span in ranges.items()}
    history = _parquet_frame(spark, whole, edges, opts.include_headers)
    todo = {tp: spans for tp, spans in rest.items() if spans}
    log.info(
        "ister.spark.read: %d offsets from %d Parquet copies, %d through the ister format",
        sum(b - a for spans in covered.values() for a, b in spans),
        len(whole) + sum(map(len, edges.values())),
        sum(b - a for spans in todo.values() for a, b in spans),
    )
    if not todo:
        return history
    encoded: dict[str, dict[str, list[list[int]]]] = {}
    for tp, spans in todo.items():
        encoded.setdefault(tp.topic, {})[str(tp.partition)] = [[a, b] for a, b in spans]
    tail_options = {k: v for k, v in given.items() if k.lower() not in ("startingoffsets", "endingoffsets")}
    tail_options[RANGES] = json.dumps(encoded)
    tail = spark.read.format("ister").options(**tail_options).load()
    return history.unionByName(tail)


def _hadoop_base(store_url: str | None, parquet_url: str | None) -> str | None:
    """Where Spark's JVM finds the store's keys: `ister.read.parquetUrl`, or a `file://` store as it is
    (the JVM has no other object store client here, e.g. no hadoop-aws for s3a)."""
    if parquet_url:
        return parquet_url
    if store_url and urlsplit(store_url).scheme == "file":
        return store_url.rstrip("/")
    return None


def _checked(url: str | None, storage_options: dict[str, str], copies: dict[Span, str]) -> dict[Span, str]:
    """The copies whose footer fits their range (schema, row count, offset bounds), read with one suffix
    GET each on the driver. A missing or damaged one is left to the ister format (its object is read)."""
    from ister.storage.objects import parquet
    from ister.storage.objects.store import open_store

    if not url or not copies:
        return {}

    async def check(store: Any, span: Span, key: str) -> bool:
        try:
            tail, size = await store.get_tail(key, parquet.FOOTER_READ)
            meta = parquet.footer_metadata(tail)
            if meta is None and size > len(tail):  # a footer larger than the first read
                tail, _ = await store.get_tail(key, size)
                meta = parquet.footer_metadata(tail)
            problem = "no Parquet footer" if meta is None else parquet.check_metadata(meta, *span)
        except Exception as exc:
            problem = str(exc)
        if problem is not None:
            log.warning("Parquet copy %s not used (%s); its offsets are read from the object", key, problem)
        return problem is None

    async def check_all() -> dict[Span, str]:
        store = open_store(url, storage_options)
        items = sorted(copies.items())
        ok = await asyncio.gather(*(check(store, span, key) for span, key in items))
        return {span: key for (span, key), good in zip(items, ok, strict=True) if good}

    return asyncio.run(check_all())


def _minus(span: Span, covered: list[Span]) -> list[Span]:
    """[start, end) without the (sorted, disjoint) covered spans."""
    out: list[Span] = []
    at, end = span
    for a, b in sorted(covered):
        if a > at:
            out.append((at, min(a, end)))
        at = max(at, b)
    if at < end:
        out.append((at, end))
    return [(a, b) for a, b in out if a < b]


def _parquet_frame(
    spark: Any,
    whole: list[str],
    edges: dict[TopicPartition, list[tuple[str, Span]]],
    include_headers: bool,
) -> Any:
    """The copies as one DataFrame: those inside the range read as they are (their footers were checked
    to hold exactly their object's offsets: no filter to evaluate per row), the few cut by a range's ends
    filtered to the offsets planned."""
    from pyspark.sql import functions as F

    from ister.storage.objects.parquet import BASE_COLUMNS

    columns = [*BASE_COLUMNS, "headers"] if include_headers else BASE_COLUMNS

    def scan(files: list[str]) -> Any:
        # the copies have page checksums: a damaged page fails the query instead of giving wrong rows
        reader = spark.read.schema(ddl(True)).option("parquet.page.verify-checksum.enabled", "true")
        return reader.parquet(*files)

    frames = [scan(whole).select(*columns)] if whole else []
    for tp, cut in sorted(edges.items()):
        for url, (a, b) in cut:
            wanted = (
                (F.col("topic") == F.lit(tp.topic))
                & (F.col("partition") == F.lit(tp.partition))
                & (F.col("offset") >= F.lit(a))
                & (F.col("offset") < F.lit(b))
            )
            frames.append(scan([url]).where(wanted).select(*columns))
    return reduce(lambda x, y: x.unionByName(y), frames)


__all__ = ["read"]
