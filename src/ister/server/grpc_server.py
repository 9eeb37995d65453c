"""The client-facing gRPC server (port 6650 by default) and the Prometheus exporter."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import grpc

from ister.broker import metrics
from ister.broker.service import BrokerService
from ister.config import TlsFiles, split_host_port
from ister.limits import DEFAULT_METRICS_MAX_TOPICS, GRPC_MAX_MESSAGE_BYTES
from ister.security.api_keys import ApiKeyStore
from ister.server.danube_api import add_danube_services
from ister.server.ister_api import add_ister_service
from ister.server.metrics_http import MetricsServer, Route, start_metrics_server
from ister.server.replica_api import LeaderLookup, add_replica_service
from ister.server.schema_api import add_schema_service
from ister.server.tls import bind

# gRPC's own size limits sit well above the message-size policy so that an oversize message gets the
# broker's INVALID_ARGUMENT, not gRPC's RESOURCE_EXHAUSTED (which the official client retries for ever).
SERVER_OPTIONS = [
    ("grpc.max_receive_message_length", GRPC_MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", GRPC_MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
]


async def start_client_server(
    broker: BrokerService,
    addr: str,
    *,
    tls: TlsFiles | None = None,
    interceptors: Sequence[Any] = (),
    api_keys: ApiKeyStore | None = None,
    replica_leaders: LeaderLookup | None = None,
) -> Any:
    """Serve the client API on `addr`, over TLS when `tls` names files; `interceptors` (authentication
    and authorization) only when security is on. `replica_leaders`: a cluster's replicated topics this
    broker leads, for its peers' fetches."""
    server = grpc.aio.server(options=SERVER_OPTIONS, interceptors=list(interceptors) or None)
    add_danube_services(server, broker)
    add_ister_service(server, broker, api_keys)
    add_schema_service(server, broker)
    # Served in standalone mode too (it leads nothing: UNAVAILABLE), so the method answers like every other.
    add_replica_service(server, replica_leaders or (lambda _topic: None))
    bound = bind(server, addr, tls, "broker_addr")
    if bound == 0:
        raise OSError(f"cannot listen on {addr} (address in use or not local)")
    await server.start()
    return server


def start_prometheus(
    addr: str,
    *,
    per_topic: bool = True,
    max_topics: int = DEFAULT_METRICS_MAX_TOPICS,
    tls: TlsFiles | None = None,
    bearer_token_file: str | None = None,
    routes: Mapping[str, Route] | None = None,
) -> MetricsServer:
    """The Prometheus exporter on its own thread (`server/metrics_http.py`), bounded per-topic series,
    over TLS when `tls` names files and behind a bearer token when `bearer_token_file` is set."""
    host, port = split_host_port(addr, "prom_exporter")
    metrics.configure(per_topic=per_topic, max_topics=max_topics)
    return start_metrics_server(host, port, tls=tls, bearer_token_file=bearer_token_file, routes=routes)
