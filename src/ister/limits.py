"""Hard limits and defaults in one place, so every bound in the system has a name."""

from __future__ import annotations

MiB = 1024 * 1024
GiB = 1024 * MiB

# Names (topics, namespaces, producers, consumers, subscriptions).
MAX_NAME_LEN = 255

# Messages.
DEFAULT_MAX_MESSAGE_SIZE = 10 * MiB  # policy default, as Danube
GRPC_MAX_MESSAGE_BYTES = 64 * MiB  # gRPC's own limit sits well above the policy so the broker answers first
MAX_ATTRIBUTES = 256
MAX_ATTRIBUTE_BYTES = 64 * 1024  # UTF-8 bytes of every attribute name and value together
MAX_ROUTING_KEY_CHARS = 4 * MAX_NAME_LEN  # 1,020 characters

# The wire's integer ranges (protobuf uint32 / uint64): a stored record must fit them to be delivered.
U32_MAX = 2**32 - 1
U64_MAX = 2**64 - 1

# Error messages quote client input cut to this many characters: gRPC carries the message in a header,
# and one that exceeds the client's metadata limit turns into RESOURCE_EXHAUSTED (retried for ever).
MAX_ECHO_CHARS = 200
# The whole status message, as a last guard at the servicer boundary: UTF-8 bytes, as gRPC percent-encodes
# every byte outside printable ASCII (three characters each), so this stays well inside an 8 KiB header.
MAX_STATUS_MESSAGE_BYTES = 1_024

# Reliable dispatch.
DEFAULT_WINDOW = 10
MIN_WINDOW = 1
MAX_WINDOW = 10_000
# Key-Shared: messages of keys no attached consumer's filters accept wait for one outside the window (so they
# do not stall the other keys), this many per subscription at most (their records stay in memory).
KEY_SHARED_UNMATCHED_LIMIT = 1_000
HEARTBEAT_SECONDS = 0.5
CURSOR_FLUSH_SECONDS = 5.0
CURSOR_FLUSH_ACKS = 1_000

# Offset reads (batch API Read / SetCursor).
MAX_READ_OFFSET = 2**63  # offsets are u64 on the wire, Spark's are signed 64-bit
MAX_READ_RECORDS = 65_536  # records per Read batch; larger requests are capped to this

# Non-reliable dispatch: per-consumer buffer; a full buffer drops (at-most-once).
NON_RELIABLE_CONSUMER_BUFFER = 1_000

# Reliable consumer stream buffer (bounded by the window anyway; this is a safety cap).
RELIABLE_CONSUMER_BUFFER = MAX_WINDOW

# Timeouts.
METADATA_TIMEOUT_SECONDS = 10.0
SHUTDOWN_GRACE_SECONDS = 10.0
PUBLISH_TIMEOUT_SECONDS = 30.0  # a WAL that cannot fsync within this fails the send (retriable)
MAX_NACK_REASON_BYTES = 1024

# Prometheus exporter (one thread, off the event loop).
DEFAULT_METRICS_MAX_TOPICS = 500  # topics with per-topic series per scrape (metrics.max_topics)
MAX_METRICS_TOPICS = 100_000
METRICS_MAX_CONNECTIONS = 16  # open scrape connections; more are answered 503 and closed
METRICS_IDLE_SECONDS = 30.0  # a connection with no request (or no progress writing) for this long is closed
METRICS_MAX_REQUEST_BYTES = 8 * 1024  # request line + headers
METRICS_RENDER_DUTY = 0.1  # rendering takes at most this share of a core, however many scrapers
METRICS_MIN_CACHE_SECONDS = 0.0  # scrapes closer than this to the last rendering share it

# Health endpoints on the metrics port (broker/health.py): /healthz and /readyz.
HEALTH_LOOP_STALE_SECONDS = 10.0  # /healthz fails when the event loop has not run for this long
READY_CHECK_SECONDS = 1.0  # readiness probes run this often on the event loop
READY_PROBE_TIMEOUT_SECONDS = 3.0  # a probe (a metadata read) that takes longer fails readiness
READY_STALE_SECONDS = 5.0  # /readyz fails when the probes' last result is older than this
