"""Ports handed to test and benchmark servers (ister.benchmark.broker)."""

from __future__ import annotations

from ister.benchmark.broker import free_port


def test_free_port_never_hands_out_a_port_twice() -> None:
    # A cluster's ports are all picked before its servers bind them: a repeat made two brokers collide.
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
