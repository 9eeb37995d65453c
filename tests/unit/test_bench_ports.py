"""Ports handed to test and benchmark servers (ister.devcluster.ports)."""

from __future__ import annotations

import socket

import pytest

from ister.devcluster.ports import free_port, port_range


def test_free_port_never_hands_out_a_port_twice() -> None:
    # A cluster's ports are all picked before its servers bind them: a repeat made two brokers collide.
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    assert all(p in port_range() for p in ports)


def test_free_port_skips_a_port_in_use() -> None:
    ports = port_range()
    at = ports.index(free_port())
    with socket.socket() as taken:
        for step in range(1, 100):  # the next port of the range that can be taken (the next pick's)
            ahead = ports[(at + step) % len(ports)]
            try:
                taken.bind(("127.0.0.1", ahead))
                break
            except OSError:
                continue
        taken.listen()
        got = free_port()
        assert got != ahead and got in ports


def test_xdist_workers_pick_from_disjoint_ranges_below_the_ephemeral_ports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
    ranges = []
    for worker in ("gw0", "gw1", "gw2"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        ranges.append(set(port_range()))
    assert all(len(r) >= 3000 for r in ranges)
    assert not (ranges[0] & ranges[1]) and not (ranges[1] & ranges[2]) and not (ranges[0] & ranges[2])
    # Below the kernel's ephemeral ports, clear of SeaweedFS's gRPC ports (+10,000) and of the ports the
    # peer benchmarks bind (shared/peers: NATS, iperf3, Redis).
    every = set().union(*ranges)
    assert max(every) < 32_768 and not {p + 10_000 for p in every} & every
    assert not {14_222, 15_201, 16_379} & every
