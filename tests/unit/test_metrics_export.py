"""Per-topic series bounded by `metrics.per_topic` / `metrics.max_topics`, and the exporter's HTTP server:
one thread, bounded connections, idle timeouts, 404 off /metrics, shared renderings."""

from __future__ import annotations

import gzip
import http.client
import socket
import threading
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ister.broker.metrics import SUB_LABELS, TOPIC_LABELS, TopicFamily, TopicSeries
from ister.server.metrics_http import MetricsServer

# -- series --------------------------------------------------------------------------------------------------


def _families() -> tuple[TopicFamily, TopicFamily, TopicFamily]:
    lag = TopicFamily("t_lag", "lag", "gauge", SUB_LABELS, "t_broker_lag", "all lag", rank="backlog")
    out = TopicFamily("t_out", "out", "counter", SUB_LABELS, "t_broker_out", "all out", rank="traffic")
    msgs_in = TopicFamily("t_in", "in", "counter", TOPIC_LABELS, "t_broker_in", "all in", rank="traffic")
    return lag, out, msgs_in


def _samples(series: TopicSeries) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    registry.register(series)
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _topics(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> set[str]:
    return {dict(labels)["topic"] for _, labels in samples if "topic" in dict(labels)}


def test_family_counts_and_forgets() -> None:
    lag, out, _ = _families()
    out.labels("/a/t", "s").inc()
    out.labels("/a/t", "s").inc(4)
    lag.labels("/a/t", "s").set(7)
    assert out.value("/a/t", "s") == 5 and lag.value("/a/t", "s") == 7
    out.remove("/a/t", "s")
    lag.remove("/a/t", "s")
    assert out.value("/a/t", "s") is None
    with pytest.raises(KeyError):
        out.remove("/a/t", "s")
    # A counter's broker total keeps what removed series counted; a gauge's is what is there now.
    out.labels("/a/u", "s").inc(2)
    assert TopicFamily.total(out.snapshot()) == 7
    assert TopicFamily.total(lag.snapshot()) == 0
    with pytest.raises(ValueError):
        out.labels("/a/t")


def test_all_topics_when_under_the_limit() -> None:
    lag, out, msgs_in = _families()
    for t in ("/a/x", "/a/y"):
        msgs_in.labels(t).inc(3)
        out.labels(t, "s").inc(2)
        lag.labels(t, "s").set(1)
    samples = _samples(TopicSeries((lag, out, msgs_in), max_topics=10))
    assert _topics(samples) == {"/a/x", "/a/y"}
    assert samples[("t_in_total", (("topic", "/a/x"),))] == 3
    assert samples[("t_out_total", (("subscription", "s"), ("topic", "/a/y")))] == 2
    assert samples[("t_broker_in_total", ())] == 6
    assert samples[("t_broker_lag", ())] == 2
    assert samples[("ister_metrics_topics", (("series", "exported"),))] == 2
    assert samples[("ister_metrics_topics", (("series", "omitted"),))] == 0


def test_top_topics_by_backlog_then_traffic_then_name() -> None:
    lag, out, msgs_in = _families()
    for i in range(10):
        msgs_in.labels(f"/a/t{i}").inc(i)  # traffic grows with i
    lag.labels("/a/t1", "s").set(100)  # the largest backlog wins over any traffic
    lag.labels("/a/t0", "s").set(0)
    msgs_in.labels("/a/q").inc(9)  # ties with t9 on traffic: the name decides
    samples = _samples(TopicSeries((lag, out, msgs_in), max_topics=3))
    assert _topics(samples) == {"/a/t1", "/a/q", "/a/t9"}
    assert samples[("ister_metrics_topics", (("series", "exported"),))] == 3
    assert samples[("ister_metrics_topics", (("series", "omitted"),))] == 8
    # Totals cover every topic, exported or not.
    assert samples[("t_broker_in_total", ())] == sum(range(10)) + 9
    assert samples[("t_broker_lag", ())] == 100


@pytest.mark.parametrize("series", [TopicSeries(per_topic=False, max_topics=10), TopicSeries(max_topics=0)])
def test_per_topic_series_off(series: TopicSeries) -> None:
    lag, out, msgs_in = _families()
    series.families = (lag, out, msgs_in)
    msgs_in.labels("/a/x").inc(3)
    samples = _samples(series)
    assert _topics(samples) == set()
    assert samples[("t_broker_in_total", ())] == 3
    assert samples[("ister_metrics_topics", (("series", "omitted"),))] == 1


# -- the server ----------------------------------------------------------------------------------------------


class Render:
    """A render function that counts its calls and can pretend to take a while (on a fake clock)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.calls = 0
        self.takes = 0.0

    def clock(self) -> float:
        return self.now

    def __call__(self) -> bytes:
        self.calls += 1
        self.now += self.takes
        return f"# rendering {self.calls}\nx_total {self.calls}\n".encode()


@pytest.fixture
def render() -> Render:
    return Render()


@pytest.fixture
def server(render: Render) -> Iterator[MetricsServer]:
    s = MetricsServer("127.0.0.1", 0, render, max_connections=3, idle_seconds=0.3, clock=render.clock).start()
    yield s
    s.shutdown()


def _get(
    server: MetricsServer, path: str = "/metrics", method: str = "GET", headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def test_metrics_path_and_others(server: MetricsServer) -> None:
    status, headers, body = _get(server)
    assert status == 200 and body.startswith(b"# rendering")
    assert headers["content-type"].startswith("text/plain; version=0.0.4")
    assert int(headers["content-length"]) == len(body)
    assert _get(server, "/metrics?x=1")[0] == 200
    status, headers, body = _get(server, method="HEAD")
    assert status == 200 and body == b"" and int(headers["content-length"]) > 0
    assert _get(server, "/")[0] == 404
    assert _get(server, "/metricsx")[0] == 404
    status, headers, _ = _get(server, method="POST")
    assert status == 405 and headers["allow"] == "GET, HEAD"


def test_gzip_when_asked(server: MetricsServer) -> None:
    status, headers, body = _get(server, headers={"Accept-Encoding": "gzip"})
    assert status == 200 and headers["content-encoding"] == "gzip"
    assert gzip.decompress(body).startswith(b"# rendering")


def test_keep_alive_serves_several_requests_on_one_connection(server: MetricsServer, render: Render) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        for _ in range(3):
            render.now += 1.0  # each request is due for a new rendering
            conn.request("GET", "/metrics")
            resp = conn.getresponse()
            assert resp.status == 200 and resp.read().startswith(b"# rendering")
    finally:
        conn.close()
    assert render.calls == 3


def test_scrapes_share_a_rendering_that_took_a_while(server: MetricsServer, render: Render) -> None:
    render.takes = 1.0  # on the fake clock: the next rendering waits (1 / 0.1 - 1) * 1 s = 9 s
    bodies = [_get(server)[2] for _ in range(5)]
    assert render.calls == 1 and len(set(bodies)) == 1
    render.now += 8.5
    assert _get(server)[2] == bodies[0]
    render.now += 1.0
    assert _get(server)[2] != bodies[0]
    assert render.calls == 2 == server.renders


def _connect(server: MetricsServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def _read_all(sock: socket.socket) -> bytes:
    """Everything until the server closes the connection (the socket timeout is only a backstop)."""
    out = b""
    while chunk := sock.recv(4096):
        out += chunk
    return out


def test_connection_limit_without_more_threads(server: MetricsServer) -> None:
    threads = threading.active_count()
    idle = [_connect(server) for _ in range(3)]
    try:
        # The server has taken the three (it answers on one of them only when asked): the fourth is refused.
        extra = _connect(server)
        with extra:
            assert _read_all(extra).startswith(b"HTTP/1.1 503")
        assert threading.active_count() == threads
        idle[0].close()  # a free slot: served again once the server has seen the close
        while True:
            with _connect(server) as again:
                again.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                try:
                    if _read_all(again).startswith(b"HTTP/1.1 200"):
                        break
                except ConnectionResetError:  # refused (503) before the server saw the close
                    continue
    finally:
        for sock in idle:
            sock.close()


def test_idle_connection_is_closed(render: Render) -> None:
    s = MetricsServer("127.0.0.1", 0, render, idle_seconds=0.2).start()  # the real clock
    try:
        with _connect(s) as sock:
            sock.sendall(b"GET /met")  # a request that never completes
            assert _read_all(sock) == b""  # closed by the server, not answered
        with _connect(s) as sock:  # a connection that sends nothing at all
            assert _read_all(sock) == b""
    finally:
        s.shutdown()


def test_oversize_and_malformed_requests(server: MetricsServer) -> None:
    with _connect(server) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 10_000)
        assert _read_all(sock).startswith(b"HTTP/1.1 431")
    with _connect(server) as sock:
        sock.sendall(b"HELLO\r\n\r\n")
        assert _read_all(sock).startswith(b"HTTP/1.1 400")


def test_shutdown_closes_the_port(render: Render) -> None:
    s = MetricsServer("127.0.0.1", 0, render).start()
    port = s.port
    s.shutdown()
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0


def test_rendering_failure_is_answered(render: Render) -> None:
    def broken() -> bytes:
        raise RuntimeError("boom")

    s = MetricsServer("127.0.0.1", 0, broken).start()
    try:
        status, _, body = _get(s)
        assert status == 200 and b"rendering failed" in body
    finally:
        s.shutdown()
