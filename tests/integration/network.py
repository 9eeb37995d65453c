"""Network partitions between brokers, etcd and clients, made with Linux network namespaces and iptables.

A `Network` is one bridge in the root namespace (which keeps the .1 address of the bridge's /24: etcd and
the test's clients live there) and one namespace per broker, joined to the bridge by a veth pair, with its
own address (.11, .12, ...). Every fault is a set of iptables rules inside a broker's namespace, matched by
address and port, so the three paths stay separable:

- broker <-> broker: the other broker's address (replication streams and every other peer call);
- broker <-> etcd: the root address and the etcd client port;
- client <-> broker: the root address and the broker's client port (etcd's port is another one).

`heal()` flushes every rule. Nothing here delays packets (the kernel here has no netem): a fault drops or
resets. Needs root; `unavailable()` says why it cannot work, for a skip. Bench scripts can import it too.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass

_instances = itertools.count()  # several Networks in one process get different names and subnets


class NetworkError(RuntimeError):
    """An `ip` or `iptables` command failed; the message holds the command and its stderr."""


def run(*cmd: str) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise NetworkError(f"{' '.join(cmd)} exited with {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def unavailable() -> str | None:
    """Why namespaces and iptables cannot be used here (None: they can)."""
    if os.geteuid() != 0:
        return "network partition tests need root (network namespaces and iptables)"
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed: run `make test` (installs iptables) or apt-get install iptables"
    return None


@dataclass(frozen=True)
class Host:
    """One broker's namespace: its name, its veth's root-side name and its address."""

    netns: str
    veth: str
    ip: str


def _subnets_in_use() -> set[str]:
    """The 10.x.y prefixes of every IPv4 address or route on this machine (other runs' bridges included)."""
    out = run("ip", "-4", "-o", "addr", "show") + run("ip", "-4", "route", "show")
    used = set()
    for word in out.split():
        if word.startswith("10."):
            parts = word.split("/")[0].split(".")
            if len(parts) == 4:
                used.add(".".join(parts[:3]))
    return used


class Network:
    """A bridge, its subnet and one namespace per broker; `close()` removes all of it (idempotent)."""

    def __init__(self, brokers: int) -> None:
        # Names are unique per process (pid) and per Network in it: pytest-xdist workers are processes.
        # Interface names must stay within 15 characters: "is" + pid (<= 7 digits) + "x" + n + suffix.
        self.index = next(_instances)
        self.tag = f"is{os.getpid()}x{self.index}"
        self.bridge = f"{self.tag}b"
        self.prefix = self._pick_subnet()
        self.root_ip = f"{self.prefix}.1"
        self.hosts = [
            Host(f"{self.tag}n{i}", f"{self.tag}v{i}", f"{self.prefix}.{11 + i}") for i in range(brokers)
        ]
        self._created = False
        self._ports: dict[str, int] = {}  # host ip -> the broker's client port there
        self.etcd_port = 0

    def _pick_subnet(self) -> str:
        # From the pid, so concurrent runs start apart; then past any prefix already in use here.
        start = os.getpid() * 7 + self.index * 97
        used = _subnets_in_use()
        for step in range(200 * 256):
            n = (start + step) % (200 * 256)
            prefix = f"10.{50 + n // 256}.{n % 256}"
            if prefix not in used:
                return prefix
        raise NetworkError("no free 10.x.y.0/24 subnet")

    # -- lifetime ---------------------------------------------------------------------------------------
    def create(self) -> Network:
        sweep_stale()
        self._remove()  # a stale one from an earlier process with the same pid
        self._created = True
        run("ip", "link", "add", self.bridge, "type", "bridge")
        run("ip", "addr", "add", f"{self.root_ip}/24", "dev", self.bridge)
        run("ip", "link", "set", self.bridge, "up")
        for i, host in enumerate(self.hosts):
            inner = f"{self.tag}i{i}"
            run("ip", "netns", "add", host.netns)
            run("ip", "link", "add", host.veth, "type", "veth", "peer", "name", inner)
            run("ip", "link", "set", inner, "netns", host.netns)
            run("ip", "link", "set", host.veth, "master", self.bridge)
            run("ip", "link", "set", host.veth, "up")
            self.ns(host, "ip", "addr", "add", f"{host.ip}/24", "dev", inner)
            self.ns(host, "ip", "link", "set", inner, "up")
            self.ns(host, "ip", "link", "set", "lo", "up")
        return self

    def close(self) -> None:
        if self._created:
            self._remove()
            self._created = False

    def _remove(self) -> None:
        """Delete every namespace, veth and the bridge of this name that exists; errors only if one stays."""
        namespaces = run("ip", "netns", "list")
        for host in self.hosts:
            if any(line.split()[0] == host.netns for line in namespaces.splitlines() if line.strip()):
                run("ip", "netns", "delete", host.netns)  # takes the namespace's end of the veth with it
            _delete_link(host.veth)  # usually gone with the namespace, a moment later
        _delete_link(self.bridge)

    def __enter__(self) -> Network:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- who is where -----------------------------------------------------------------------------------
    def ns(self, host: Host, *cmd: str) -> str:
        return run("ip", "netns", "exec", host.netns, *cmd)

    def prefix_command(self, host: Host) -> list[str]:
        """What to put before a command to run it inside `host`'s namespace (`ip netns exec` execs: the
        process id stays the command's)."""
        return ["ip", "netns", "exec", host.netns]

    def serves(self, host: Host, client_port: int) -> None:
        """Record the client port of the broker in `host` (client faults match on it)."""
        self._ports[host.ip] = client_port

    # -- faults: each is a few iptables rules in a broker's namespace ---------------------------------------
    def _rule(self, host: Host, *rule: str) -> None:
        self.ns(host, "iptables", "-w", "-A", *rule)

    def cut_one_way(self, src: Host, dst: Host) -> None:
        """Packets from broker `src` to broker `dst` are lost (the other way still flows, so TCP's
        handshakes and acknowledgements fail for connections either side opened)."""
        self._rule(src, "OUTPUT", "-d", dst.ip, "-j", "DROP")
        self._rule(dst, "INPUT", "-s", src.ip, "-j", "DROP")

    def cut(self, a: Host, b: Host) -> None:
        """Nothing passes between brokers `a` and `b`, either way."""
        self.cut_one_way(a, b)
        self.cut_one_way(b, a)

    def reset(self, a: Host, b: Host) -> None:
        """Every TCP segment between `a` and `b` is answered with a reset: connections break at once and
        new ones are refused (the peer sees ECONNRESET / ECONNREFUSED, not silence)."""
        # Resets themselves pass (`--tcp-flags RST NONE`: only segments without RST are rejected), or the
        # reset one side makes would be dropped by the other side's rule and the peer would see silence.
        reject = ("-p", "tcp", "--tcp-flags", "RST", "NONE", "-j", "REJECT", "--reject-with", "tcp-reset")
        for x, y in ((a, b), (b, a)):
            self._rule(x, "OUTPUT", "-d", y.ip, *reject)
            self._rule(x, "INPUT", "-s", y.ip, *reject)

    def isolate_from_etcd(self, host: Host) -> None:
        """The broker in `host` can no longer reach etcd (its lease keep-alives are lost); its other paths
        (peers, clients) stay."""
        assert self.etcd_port, "set etcd_port first"
        port = str(self.etcd_port)
        self._rule(host, "OUTPUT", "-d", self.root_ip, "-p", "tcp", "--dport", port, "-j", "DROP")
        self._rule(host, "INPUT", "-s", self.root_ip, "-p", "tcp", "--sport", port, "-j", "DROP")

    def isolate_from_clients(self, host: Host) -> None:
        """Clients (the root namespace) can no longer reach the broker's client port; its peers (other
        brokers' replica streams to the same port) and etcd still can."""
        port = str(self._ports[host.ip])
        self._rule(host, "INPUT", "-s", self.root_ip, "-p", "tcp", "--dport", port, "-j", "DROP")
        self._rule(host, "OUTPUT", "-d", self.root_ip, "-p", "tcp", "--sport", port, "-j", "DROP")

    def heal(self) -> None:
        """Remove every fault."""
        for host in self.hosts:
            self.ns(host, "iptables", "-w", "-F")

    def rules(self, host: Host) -> str:
        return self.ns(host, "iptables", "-w", "-S")


_NAME = re.compile(r"^is(\d+)x\d+[nbv]\d*$")  # a Network's namespace, bridge or veth (Network.__init__)


def sweep_stale() -> None:
    """Delete the namespaces, bridges and veths left by test processes that were killed before their teardown
    (their pid is gone). Only names of this module's pattern; a live process's are never touched."""

    def dead(name: str) -> bool:
        m = _NAME.match(name)
        return m is not None and not os.path.exists(f"/proc/{m.group(1)}")

    for line in run("ip", "netns", "list").splitlines():
        name = line.split()[0] if line.strip() else ""
        if dead(name):
            run("ip", "netns", "delete", name)
    for line in run("ip", "-o", "link", "show").splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if dead(name):
            _delete_link(name)  # a veth takes its peer with it


def _link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", name], capture_output=True).returncode == 0


def _delete_link(name: str) -> None:
    """Delete a link if it exists; one the kernel removes meanwhile (a veth whose peer's namespace was
    just deleted) is fine, one that stays is an error."""
    if not _link_exists(name):
        return
    try:
        run("ip", "link", "delete", name)
    except NetworkError:
        if _link_exists(name):
            raise
