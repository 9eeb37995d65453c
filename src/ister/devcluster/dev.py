"""`ister dev up`: etcd, SeaweedFS (with S3) and N cluster brokers on this machine, in the foreground.

Start order: etcd, S3, the brokers (each also waits for etcd itself, ister/startwait.py). While it runs,
a service that exits is started again (a broker after a backoff: one that keeps failing is not restarted
in a busy loop); that is also how `ister dev restart-broker N` works: it stops broker N and this restarts
it. SIGINT/SIGTERM stop everything in order: brokers (gracefully), then S3, then etcd. Data stays in the
dev directory for the next `up`. Children run in process groups of their own, so a terminal's Ctrl-C
reaches only `up`, which then stops them in that order.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ister.core.backoff import Backoff, Retries
from ister.devcluster.broker import BrokerNode
from ister.devcluster.console import ConsoleServer
from ister.devcluster.etcd import EtcdServer
from ister.devcluster.group import BrokerGroup
from ister.devcluster.seaweed import SeaweedServer
from ister.devcluster.spec import BUCKET, BrokerPlan, S3Target, replication_factor
from ister.devcluster.state import Plan, write_state

READY_SECONDS = 90.0  # bound on every broker answering /readyz 200 after `up` (then it runs anyway)
STOP_SECONDS = 30.0  # a broker's graceful stop, then SIGKILL
SUPERVISE_EVERY = 0.25  # how often exited children are looked for (a stop wakes the loop at once)
RESTART_BACKOFF = Backoff(first=1.0, cap=30.0)


class DevCluster:
    def __init__(
        self, directory: Path, plan: Plan, say: Callable[[str], None], *, console: bool = False
    ) -> None:
        self.dir = directory
        self.plan = plan
        self.say = say
        p = plan.ports
        self.etcd = EtcdServer(
            directory / "etcd", name="ister-dev", ports=(p.etcd_client, p.etcd_peer), own_session=True
        )
        self.s3 = (
            SeaweedServer(directory / "s3", bucket=BUCKET, ports=p.weed, own_session=True)
            if plan.s3
            else None
        )
        self.broker_plan = BrokerPlan(
            plan.brokers,
            [self.etcd.endpoint],
            s3=S3Target(self.s3.endpoint) if self.s3 is not None else None,
            file_tier=(directory / "objects").resolve().as_uri(),
            catalog_uri=f"sqlite:///{(directory / 'tables' / 'catalog.db').resolve()}",
        )
        self.config_file = directory / "ister.yml"
        args = self.broker_plan.args(self.config_file)
        self.group = BrokerGroup(
            plan.brokers,
            lambda i: BrokerNode(
                directory / f"broker-{i}",
                *args,
                ports=p.brokers[i],
                log_path=directory / f"broker-{i}.log",
                own_session=True,
                ister_env=False,  # the plan is the whole configuration, not this shell's ISTER_* variables
            ),
        )
        self.brokers = self.group.brokers
        # The console reads broker-0's admin API (which answers for the whole cluster).
        self.console = (
            ConsoleServer(directory, self.brokers[0].admin_addr, p.console, own_session=True)
            if console
            else None
        )
        self._restarts = [Retries(RESTART_BACKOFF) for _ in self.brokers]
        self._restart_at: list[float | None] = [None for _ in self.brokers]
        self.phase = "starting"

    # -- what runs ----------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        services: list[dict[str, Any]] = [
            {
                "name": "etcd",
                "pid": self.etcd.proc.pid if self.etcd.proc else None,
                "marker": "etcd",
                "addresses": {"client": self.etcd.url},
            },
        ]
        if self.s3 is not None:
            services.append(
                {
                    "name": "s3",
                    "pid": self.s3.proc.pid if self.s3.proc else None,
                    "marker": "weed",
                    "addresses": {"s3": self.s3.endpoint, "bucket": self.s3.bucket},
                }
            )
        for i, b in enumerate(self.brokers):
            services.append(
                {
                    "name": f"broker-{i}",
                    "pid": b.pid,
                    "marker": "ister.cli",
                    "addresses": {
                        "client": b.url,
                        "admin": b.admin_addr,
                        "metrics": b.metrics_url,
                        "readyz": b.readyz_url,
                    },
                    "log": str(b.log_path),
                }
            )
        if self.console is not None:
            services.append(
                {
                    "name": "console",
                    "pid": self.console.proc.pid if self.console.proc else None,
                    "marker": "console",
                    "addresses": {"http": self.console.url},
                    "log": str(self.console.log_path),
                }
            )
        return {
            "pid": os.getpid(),
            "phase": self.phase,
            "dir": str(self.dir.resolve()),
            "brokers": self.plan.brokers,
            "replication_factor": replication_factor(self.plan.brokers),
            "durable_tier": self.broker_plan.config()["storage"]["durable"]["url"],
            "services": services,
        }

    def save(self) -> None:
        write_state(self.dir, self.state())

    # -- start and stop -----------------------------------------------------------------------------------
    def start(self, stop: threading.Event | None = None) -> list[str]:
        """Start everything; the brokers not ready within READY_SECONDS, with their reasons (the wait
        ends early when `stop` is set: Ctrl-C during the start)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.save()
        self.say(f"starting etcd on {self.etcd.url}")
        self.etcd.start()
        self.save()
        if self.s3 is not None:
            self.say(f"starting SeaweedFS (S3) on {self.s3.endpoint}")
            self.s3.start()
            self.save()
        self.config_file.write_text(self.broker_plan.config_yaml())
        for i, b in enumerate(self.brokers):
            self.say(f"starting broker-{i} on {b.url}")
        try:
            self.group.start()
        finally:
            self.save()
        not_ready = self.wait_ready(READY_SECONDS, stop or threading.Event())
        if self.console is not None:
            self.say(f"starting the console on {self.console.url}")
            try:
                self.console.start()
            finally:
                self.save()
        self.phase = "running"
        self.save()
        return not_ready

    def wait_ready(self, within: float, stop: threading.Event) -> list[str]:
        deadline = time.monotonic() + within
        while True:
            reasons = [f"{b.url}: {why}" for b in self.brokers if (why := readiness(b)) is not None]
            if not reasons or time.monotonic() > deadline:
                return reasons
            if stop.wait(0.2):  # poll interval; a stop ends the wait
                return reasons

    def stop(self) -> None:
        """The console, then the brokers (gracefully, all at once), then S3, then etcd."""
        self.phase = "stopping"
        self.save()
        if self.console is not None and self.console.proc is not None:
            self.console.stop()
            self.say("console stopped")
        for b in self.brokers:
            if b.running and b.proc is not None:
                b.proc.send_signal(signal.SIGTERM)
        for i, b in enumerate(self.brokers):
            if b.proc is None:
                continue
            try:
                code = b.proc.wait(STOP_SECONDS)
                self.say(f"broker-{i} stopped (status {code})")
            except subprocess.TimeoutExpired:
                self.say(f"broker-{i} did not stop within {STOP_SECONDS:.0f} s: killed")
            b.stop()
        if self.s3 is not None:
            self.s3.stop()
            self.say("SeaweedFS stopped")
        self.etcd.stop()
        self.say("etcd stopped")
        self.phase = "stopped"
        self.save()

    # -- while running ------------------------------------------------------------------------------------
    def supervise(self, stop: threading.Event) -> None:
        """Until `stop` is set: start again what exited."""
        while not stop.wait(SUPERVISE_EVERY):
            changed = False
            servers = ((self.etcd, "etcd"), (self.s3, "SeaweedFS"), (self.console, "the console"))
            for server, name in servers:
                if server is not None and not server.running and not stop.is_set():
                    self.say(f"{name} exited; starting it again")
                    try:
                        server.start()
                    except RuntimeError as exc:
                        self.say(f"{name} did not start: {exc}")
                    changed = True
            for i, b in enumerate(self.brokers):
                changed |= self._look_after(i, b)
            if changed:
                self.save()

    def _look_after(self, i: int, b: BrokerNode) -> bool:
        now = time.monotonic()
        due = self._restart_at[i]
        if due is None:
            if b.running:
                if self._restarts[i].failures and readiness(b) is None:
                    self._restarts[i].reset()  # ready again: the next exit restarts at once
                return False
            code = b.proc.returncode if b.proc is not None else None
            delay = 0.0 if not self._restarts[i].failures else self._restarts[i].peek()
            self._restarts[i].next()
            self.say(f"broker-{i} exited (status {code}); starting it again in {delay:.0f} s")
            b.proc = None
            self._restart_at[i] = now + delay
            return True
        if now < due:
            return False
        self._restart_at[i] = None
        b.launch()
        self.say(f"broker-{i} started again (pid {b.pid})")
        return True


def readiness(b: BrokerNode) -> str | None:
    """None when the broker's /readyz answers 200, else why not."""
    return readiness_at(b.readyz_url)


def readiness_at(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            resp.read()
            return None
    except urllib.error.HTTPError as exc:
        try:
            body = json.loads(exc.read())
            return "; ".join(body.get("reasons", [])) or f"HTTP {exc.code}"
        except ValueError:
            return f"HTTP {exc.code}"
    except (OSError, urllib.error.URLError) as exc:
        return f"no answer ({exc})"


def stop_left_over(state: dict[str, Any], say: Callable[[str], None]) -> int:
    """Stop the services a killed `up` left running (the console, brokers, then S3, then etcd): SIGTERM,
    then SIGKILL after STOP_SECONDS. Only processes that are still the recorded ones (`state.alive`)."""
    import psutil

    from ister.devcluster.state import alive

    services = state.get("services", [])
    groups = [
        [s for s in services if s["name"] == "console"],
        [s for s in services if s["name"].startswith("broker-")],
        [s for s in services if s["name"] == "s3"],
        [s for s in services if s["name"] == "etcd"],
    ]
    stopped = 0
    for group in groups:
        running = [s for s in group if alive(s.get("pid"), s.get("marker", ""))]
        procs = [psutil.Process(s["pid"]) for s in running]
        for proc in procs:
            proc.terminate()
        _, left = psutil.wait_procs(procs, timeout=STOP_SECONDS)
        for proc in left:
            proc.kill()
        stopped += len(procs)
        for s in running:
            say(f"{s['name']} stopped")
    return stopped
