"""A throwaway PostgreSQL server for the shared-catalog tests (docs/tables.md): initdb into a temporary
directory, `postgres` on a free loopback port with its unix socket beside the data, password login
(scram-sha-256) for the user `ister`. PostgreSQL refuses to run as root: under root the server runs as
`nobody`, in a directory of its own outside pytest's (whose parents only root may enter)."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from ister.devcluster.ports import free_port
from ister.devcluster.servers import ServerProcess

START_SECONDS = 30.0  # it accepts connections in about 1 s here; the bound only stops a broken start
USER = "ister"
PASSWORD = "catalog-secret"
DATABASE = "ister"


def postgres_bin() -> Path | None:
    """The directory of initdb and postgres (Debian keeps them out of PATH), newest version first."""
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(p.split("/")[4]))
    return Path(versions[-1]).parent if versions else None


class PostgresServer(ServerProcess):
    """`start()` runs initdb once, launches postgres and waits until a login works; `stop()` is a fast
    shutdown (SIGINT: the brokers' pooled connections would hold a SIGTERM's smart shutdown open)."""

    stop_signal = signal.SIGINT

    def __init__(self) -> None:
        bindir = postgres_bin()
        if bindir is None:
            raise RuntimeError("PostgreSQL is not installed (apt-get install postgresql)")
        self.bindir = bindir
        self.dir = Path(tempfile.mkdtemp(prefix="ister-pg-"))
        self.uid: int | None = None
        if os.geteuid() == 0:
            self.uid = pwd.getpwnam("nobody").pw_uid
            os.chown(self.dir, self.uid, -1)
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._log = None

    @property
    def log_path(self) -> Path:
        return self.dir / "postgres.log"

    @property
    def url(self) -> str:
        """The catalog URI with its password (what `tables.catalog_uri` is set to)."""
        return f"postgresql://{USER}:{PASSWORD}@127.0.0.1:{self.port}/{DATABASE}"

    def _has_ports(self) -> bool:
        return self.port != 0

    def _pick_ports(self) -> None:
        self.port = free_port()

    def _run(self, args: list[str]) -> subprocess.Popen[bytes]:
        self._log = open(self.log_path, "ab")  # noqa: SIM115  (open for the life of the process)
        return subprocess.Popen(
            args, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, user=self.uid
        )

    def _initdb(self) -> None:
        pwfile = self.dir / "pw"
        pwfile.write_text(PASSWORD)
        if self.uid is not None:
            os.chown(pwfile, self.uid, -1)
        args = [str(self.bindir / "initdb"), "-D", str(self.dir / "data"), "-U", USER, "-E", "UTF8"]
        args += ["--auth=scram-sha-256", f"--pwfile={pwfile}", "--no-sync"]
        init = self._run(args)
        code = init.wait(120)
        self._close_log()
        if code != 0:
            raise RuntimeError(f"initdb failed ({self._tail()})")

    def _launch(self) -> None:
        if not (self.dir / "data" / "PG_VERSION").exists():
            self._initdb()
        args = [str(self.bindir / "postgres"), "-D", str(self.dir / "data"), "-p", str(self.port)]
        args += ["-k", str(self.dir), "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"]
        self.proc = self._run(args)
        self._wait_ready()
        self._create_database()

    def _connect(self, database: str) -> Any:
        import psycopg2

        return psycopg2.connect(
            host="127.0.0.1", port=self.port, user=USER, password=PASSWORD, dbname=database, connect_timeout=2
        )

    def _wait_ready(self) -> None:
        """Until a login succeeds (the server answers "starting up" until its recovery is done)."""
        import psycopg2

        deadline = time.monotonic() + START_SECONDS
        last = "no answer yet"
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited during start ({self._tail()})")
            try:
                self._connect("postgres").close()
                return
            except psycopg2.OperationalError as exc:
                last = str(exc).strip()
            time.sleep(0.05)  # poll interval, not a wait for readiness
        raise RuntimeError(f"postgres not accepting logins within {START_SECONDS} s: {last} ({self._tail()})")

    def _create_database(self) -> None:
        conn = self._connect("postgres")
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,))
            if cur.fetchone() is None:
                cur.execute(f"CREATE DATABASE {DATABASE}")
        conn.close()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def remove(self) -> None:
        """Stop and delete the directory (the fixture's last step)."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


__all__ = ["DATABASE", "PASSWORD", "USER", "PostgresServer", "postgres_bin"]
