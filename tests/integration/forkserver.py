"""Brokers and `ister` commands forked from a process that has already imported Ister (issue 40 item 6).

Each `ister broker` or `ister admin ...` the tests ran spent ~0.45 s of CPU importing its modules before
doing anything, and the suite runs hundreds of each. A fork server is one Python process per test process
that imports the broker and the CLI once (`ister.cli.main`, `ister.app`, ...), freezes what it imported
(`gc.freeze`: the children's collections, and their exit, skip it) and then forks a child per command:
the child sets its own environment, working directory, session, stdout/stderr and argv, and runs
`ister.cli.main.main()` as `python -m ister.cli ...` would. The fork server stays single-threaded and
imports gRPC without using it (forking after gRPC use is what broke PySpark's JVM launch). Measured here:
a standalone broker's start and stop ~0.07 s of CPU instead of ~0.58 s (listening ~0.1 s after launch
instead of ~1 s); `ister admin namespaces list` ~0.06 s instead of ~0.41 s.

A child is the fork server's, not the test's: `ForkedProcess` stands in for the `subprocess.Popen` the
harness keeps (`pid`, `poll`, `wait`, `send_signal`, `kill`), asking the fork server for exit statuses;
signals go straight to the pid. The CPU of the children it reaps is counted in `reaped_cpu()`
(tests/cpu_per_module.py adds it to the test's). `ISTER_TEST_FORK_BROKERS=0` turns it off (everything
exec'd as before). A broker in a network namespace (`ip netns exec NS` before its command) is forked into
it (setns); one whose environment sets what a process reads only when it starts (LD_PRELOAD of the
disk-fault tests) is exec'd. A test process whose own start-time variables change (PYTHONPATH) gets a
second fork server started with them. `run_ister` runs a CLI command this way.

Requests and answers are JSON lines on the fork server's stdin and stdout.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ENABLE_ENV = "ISTER_TEST_FORK_BROKERS"
# What a broker imports before it listens (standalone and cluster mode): imported once, here.
PRELOAD = ("ister.cli.main", "ister.app", "ister.metadata.etcd", "ister.server.tls", "typer._adapters")
_CLONE_NEWNET = 0x40000000
_READ_AT_START = ("LD_", "PYTHON", "MALLOC", "GLIBC_", "GRPC_")
_ROOT = Path(__file__).resolve().parents[2]  # the repository: `tests` is importable from it
_SERVE = (
    f"import sys; sys.path.insert(0, {str(_ROOT)!r}); from tests.integration import forkserver; "
    "forkserver.serve()"
)


def enabled() -> bool:
    return os.environ.get(ENABLE_ENV, "1") != "0"


# -- the fork server's side ------------------------------------------------------------------------------


def serve() -> None:
    """The fork server's main: answer requests until stdin closes. In a forked child `_requests` returns
    the broker's argv, and the child runs the broker from here, on a clean stack, so that its exit is an
    ordinary interpreter exit (atexit handlers, flushed streams)."""
    for name in PRELOAD:
        __import__(name)
    import typer.main

    from ister.cli.main import app, main

    # typer turns the app into its click command on every run (~70 ms, and pydantic's import on first
    # use): done once here, the same command every child would build.
    command = typer.main.get_command(app)
    build = typer.main.get_command
    gc.freeze()  # what is imported stays: children's collections skip it (and leave its pages shared)
    argv = _requests()
    if argv is None:
        return
    typer.main.get_command = lambda typer_app: command if typer_app is app else build(typer_app)
    sys.argv = argv
    main()


def _requests() -> list[str] | None:
    """None once stdin closes (every child still running is killed and reaped first); in a child, its argv."""
    children: dict[int, int | None] = {}  # pid -> exit code once reaped
    cpu = 0.0  # user + system seconds of the children reaped since the last answer
    while True:
        line = sys.stdin.buffer.readline()
        if not line:
            for pid, code in children.items():
                if code is None:
                    _kill(pid)
                    os.waitpid(pid, 0)
            return None
        req = json.loads(line)
        op = req["op"]
        answer: dict[str, Any]
        if op == "spawn":
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                return _become(req)
            children[pid] = None
            answer = {"pid": pid}
        elif op == "poll":
            pid = req["pid"]
            if children.get(pid) is None:
                got, status, usage = os.wait4(pid, os.WNOHANG)
                if got == pid:
                    children[pid] = os.waitstatus_to_exitcode(status)
                    cpu += usage.ru_utime + usage.ru_stime
            answer = {"code": children[pid]}
        else:
            answer = {"error": f"unknown op {op!r}"}
        answer["cpu"] = cpu
        cpu = 0.0
        sys.stdout.buffer.write(json.dumps(answer).encode() + b"\n")
        sys.stdout.buffer.flush()


def _become(req: dict[str, Any]) -> list[str]:
    """In the child: what `subprocess.Popen(ister broker ..., stdout=log, stderr=STDOUT, stdin=DEVNULL,
    env=env, cwd=cwd, start_new_session=...)` would have set up."""
    if req["new_session"]:
        os.setsid()
    if req.get("netns"):
        _enter_netns(req["netns"])
    out = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    err = os.open(req["err"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if req.get("err") else out
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # the request pipe
    os.dup2(out, 1)  # the answer pipe
    os.dup2(err, 2)
    for fd in {out, err, null}:
        os.close(fd)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    import ister.cli  # what `python -m ister.cli` has in argv[0]: the path of its __main__.py

    return [str(Path(str(ister.cli.__file__)).with_name("__main__.py")), *req["args"]]


def _enter_netns(name: str) -> None:
    """What `ip netns exec NAME` does for a process's sockets: join the named network namespace (the
    child is single-threaded, as setns needs)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into network namespace {name}")
    finally:
        os.close(fd)


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


# -- the test process's side -----------------------------------------------------------------------------


class ForkServer:
    """The client of one fork server process (started on first use, stopped at exit)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # brokers may be started and polled from several threads
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _SERVE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=_ROOT,
        )
        self._started_with = dict(os.environ)
        self.reaped_cpu = 0.0

    def forkable(self, env: dict[str, str]) -> bool:
        """Whether a child forked here runs as one exec'd with `env` would: not when `env` changes what is
        read only when a process starts (the dynamic loader's LD_PRELOAD, the interpreter's PYTHON*, the
        allocator's, gRPC's at its import here)."""
        return not self.exec_reasons(env)

    def exec_reasons(self, env: dict[str, str]) -> list[str]:
        """The variables read at a process's start that `env` sets otherwise than this fork server has."""
        keys = {k for k in (*env, *self._started_with) if k.startswith(_READ_AT_START)}
        return sorted(
            f"{k}={env.get(k)!r} (fork server: {self._started_with.get(k)!r})"
            for k in keys
            if env.get(k) != self._started_with.get(k)
        )

    def call(self, **req: Any) -> dict[str, Any]:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        with self._lock:
            try:
                self._proc.stdin.write(json.dumps(req).encode() + b"\n")
                self._proc.stdin.flush()
                line = self._proc.stdout.readline()
            except (OSError, ValueError):  # its pipe broken, or closed by `close()`
                line = b""
        if not line:
            raise RuntimeError(f"the broker fork server exited with {self._proc.wait()}")
        answer: dict[str, Any] = json.loads(line)
        self.reaped_cpu += answer.pop("cpu", 0.0)
        if "error" in answer:
            raise RuntimeError(answer["error"])
        return answer

    def spawn(
        self,
        args: list[str],
        env: dict[str, str],
        log: Path,
        new_session: bool,
        err: Path | None = None,
        netns: str | None = None,
    ) -> ForkedProcess:
        """`ister ARGS` with stdout to `log` and stderr to `err` (None: to `log` as well), in the network
        namespace `netns` when given."""
        pid = self.call(
            op="spawn",
            args=args,
            env=env,
            cwd=os.getcwd(),
            log=str(log),
            err=str(err) if err is not None else None,
            new_session=new_session,
            netns=netns,
        )["pid"]
        return ForkedProcess(self, int(pid), args)

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        self._proc.wait(30)


class ForkedProcess:
    """A child of the fork server, with the part of `subprocess.Popen` the tests use."""

    def __init__(self, server: ForkServer, pid: int, args: list[str]) -> None:
        self._server = server
        self.pid = pid
        self.args = args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.call(op="poll", pid=self.pid)["code"]
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.001
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(delay)  # waiting for the child to exit: it signals nothing the test could await
            delay = min(delay * 2, 0.05)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # as Popen: never signal a pid that was reaped (it may be reused)
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


def run_ister(
    args: list[str], *, timeout: float, env: dict[str, str] | None = None, check: bool = False
) -> subprocess.CompletedProcess[str]:
    """`subprocess.run([*ISTER, *args], capture_output=True, text=True, timeout=..., env=env)` for a
    command of the `ister` CLI (stdin empty; `env` the whole environment, this process's by default),
    forked when forking is on: an exec'd CLI costs ~0.5 s of CPU, mostly imports."""
    full_env = dict(os.environ if env is None else env)
    forks = server()
    if forks is None or not forks.forkable(full_env):
        return subprocess.run(
            [sys.executable, "-m", "ister.cli", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=full_env,
            stdin=subprocess.DEVNULL,
            check=check,
        )
    with tempfile.TemporaryDirectory(prefix="ister-cli-") as tmp:
        out, err = Path(tmp) / "out", Path(tmp) / "err"
        proc = forks.spawn(args, full_env, out, new_session=False, err=err)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        done = subprocess.CompletedProcess(
            [*args], code, out.read_text(errors="replace"), err.read_text(errors="replace")
        )
    if check:
        done.check_returncode()
    return done


# One fork server per value of this process's start-time variables: a test may change one for good (bench/
# chaos.py, imported by test_chaos_short, puts src/ first on PYTHONPATH), and the brokers started after it
# are forked from a server started with the same; the earlier server keeps the children it has.
_servers: dict[tuple[tuple[str, str], ...], ForkServer] = {}
_server_lock = threading.Lock()


def server() -> ForkServer | None:
    """The fork server for this process's environment (started now if need be), None when turned off."""
    if not enabled():
        return None
    key = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(_READ_AT_START)))
    with _server_lock:
        if key not in _servers:
            _servers[key] = ForkServer()
            atexit.register(_servers[key].close)
        return _servers[key]


def reaped_cpu() -> float:
    """CPU seconds of the children the fork servers have reaped so far (they are not this process's
    children, so RUSAGE_CHILDREN does not count them)."""
    return sum(s.reaped_cpu for s in list(_servers.values()))
