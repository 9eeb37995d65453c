"""Driver side: which topic partitions a query reads, their offsets, and the objects holding them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from ister.client.blocking import BlockingClient
from ister.client.client import TopicOffsets
from ister.client.transport import Credentials, RpcError, open_blocking_channel, split_url
from ister.core.stream_offsets import TopicPartition
from ister.errors import FailedPrecondition, NotFound, Unavailable
from ister.spark.options import ADMIN_URL, SourceOptions
from ister.storage.objects.segment import list_topic_files
from ister.storage.objects.store import open_store
from ister.wire.gen import DanubeAdmin_pb2 as admin_pb
from ister.wire.gen import DanubeAdmin_pb2_grpc as admin_grpc

log = logging.getLogger(__name__)
ADMIN_TIMEOUT_SECONDS = 30.0


def _pattern_topics(opts: SourceOptions) -> list[str]:
    assert opts.pattern is not None and opts.admin_url is not None
    target, _ = split_url(opts.admin_url)
    creds = Credentials(token=opts.auth.token, tls_ca=opts.auth.tls_ca)
    try:
        with open_blocking_channel(opts.admin_url, creds) as channel:
            namespaces = admin_grpc.BrokerAdminStub(channel).ListNamespaces(
                admin_pb.Empty(), timeout=ADMIN_TIMEOUT_SECONDS
            )
            stub = admin_grpc.NamespaceAdminStub(channel)
            found: list[str] = []
            for ns in namespaces.namespaces:
                listed = stub.GetNamespaceTopics(
                    admin_pb.NamespaceRequest(name=ns), timeout=ADMIN_TIMEOUT_SECONDS
                )
                names = ("/" + t.lstrip("/") for t in listed.topics)  # the admin API answers `ns/topic`
                found.extend(t for t in names if opts.pattern.fullmatch(t))
    except RpcError as exc:  # a status, not the channel's debug dump
        code = exc.code()
        status = getattr(code, "name", str(code))
        raise Unavailable(f"{ADMIN_URL} {target}: cannot list topics ({status}: {exc.details()})") from None
    bases = {TopicPartition.of(t).topic for t in found}
    return sorted(bases)


def _skip(skipped: set[str], topic: str, why: str) -> None:
    if topic not in skipped:  # once per reader, not at every micro-batch
        skipped.add(topic)
        log.warning("topicsPattern: skipping %s (%s)", topic, why)


def partitions(client: BlockingClient, opts: SourceOptions, skipped: set[str]) -> list[TopicPartition]:
    """The concrete topic partitions behind the options (missing explicit topics are an error; a topic
    that matched the pattern but is gone by now is skipped)."""
    bases = list(opts.topics) if opts.pattern is None else _pattern_topics(opts)
    out: list[TopicPartition] = []
    for base in bases:
        names = client.partitions(base)
        if not names:
            if opts.pattern is not None:
                _skip(skipped, base, "it no longer exists")
                continue
            raise NotFound(f"topic {base} does not exist")
        out.extend(TopicPartition.of(n) for n in names)
    return sorted(set(out))


def describe(
    client: BlockingClient, opts: SourceOptions, tps: Iterable[TopicPartition], skipped: set[str]
) -> dict[TopicPartition, TopicOffsets]:
    """Offsets of each partition. A topic that matched `topicsPattern` but cannot be read (not reliable, or
    deleted meanwhile) is skipped with a warning; a topic named explicitly fails the query."""
    out: dict[TopicPartition, TopicOffsets] = {}
    for tp in tps:
        try:
            out[tp] = client.offsets(tp.name)
        except (FailedPrecondition, NotFound) as exc:
            if opts.pattern is None:
                raise
            _skip(skipped, tp.topic, str(exc))
    return out


def list_objects(
    url: str | None, storage_options: dict[str, str], prefix: str
) -> tuple[list[tuple[int, int, str]], dict[tuple[int, int], str]]:
    """The topic's exported objects and their Parquet copies (by range), listed straight from the store;
    nothing when it cannot be reached from here (the broker then serves those offsets too: slower, same
    records)."""
    if not url:
        return [], {}
    try:
        store = open_store(url, storage_options)
        return asyncio.run(list_topic_files(store, prefix))
    except Exception as exc:  # any failure here only costs speed
        log.warning("cannot list objects under %s at %s (%s); reading through the broker", prefix, url, exc)
        return [], {}
