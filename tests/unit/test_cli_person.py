"""The `ister` command a person meets: --version, shell completion, a refused connection failing fast
with the address, and one option name per meaning across commands."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from ister import errors
from ister.cli.main import app
from ister.client import Client
from ister.version import commit, version

ISTER_SCRIPT = Path(sys.executable).parent / "ister"  # the console script `make install` puts in .venv


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A port bound but never listening: connections to it are refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def test_version_names_the_package_version_and_the_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    commit.cache_clear()
    monkeypatch.setenv("ISTER_COMMIT", "abc123def456")
    try:
        result = CliRunner().invoke(app, ["--version"])
        assert result.exit_code == 0
        assert result.stdout == f"ister {version()} (commit abc123def456)\n"
        assert version()[0].isdigit()
        assert CliRunner().invoke(app, ["-V"]).stdout == result.stdout
    finally:
        commit.cache_clear()


def test_version_without_a_known_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    commit.cache_clear()
    monkeypatch.delenv("ISTER_COMMIT", raising=False)
    monkeypatch.setenv("PATH", "")  # no git to ask
    try:
        assert CliRunner().invoke(app, ["--version"]).stdout == f"ister {version()}\n"
    finally:
        commit.cache_clear()


@pytest.mark.skipif(not ISTER_SCRIPT.exists(), reason="the ister console script is not installed")
def test_bash_completion_installs_and_completes(tmp_path: Path) -> None:
    # Typer's own switch for tests: the shell is the one named, not detected from the parent processes (which
    # failed, "Shell None is not supported", when no shell was among the test run's ancestors).
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "SHELL": "/bin/bash",
        "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1",
    }
    done = subprocess.run(
        [str(ISTER_SCRIPT), "--install-completion", "bash"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    script = tmp_path / ".bash_completions" / "ister.sh"
    assert script.exists() and str(script) in (tmp_path / ".bashrc").read_text()
    # What bash asks when a person presses TAB after `ister admin brokers drain --`.
    words = {
        "_ISTER_COMPLETE": "complete_bash",
        "COMP_WORDS": "ister admin brokers drain --",
        "COMP_CWORD": "4",
    }
    done = subprocess.run(
        [str(ISTER_SCRIPT)], env={**env, **words}, capture_output=True, text=True, timeout=60
    )
    assert {"--wait", "--dry-run", "--admin-addr"} <= set(done.stdout.split()), done.stdout


@pytest.mark.parametrize("command", ["produce", "consume"])
def test_a_refused_connection_fails_at_once_with_the_address(command: str, refused_port: int) -> None:
    url = f"http://127.0.0.1:{refused_port}"
    args = [command, "-s", url, "-t", "/default/t", "-m", "x"]
    started = time.monotonic()
    result = CliRunner().invoke(app, args)
    took = time.monotonic() - started
    assert result.exit_code == 1, (result.stdout, result.stderr)
    assert result.stderr == (
        f"error: cannot connect to {url}: connection refused or failed (is a broker listening there?)\n"
    )
    # The message is the not-waiting client's (a waiting one says "within N s"); the bound only catches a
    # return to the library's 10 s wait, loose enough for a loaded machine (it took 1 s under load once).
    assert took < 5.0, took


async def test_the_library_client_still_waits_for_a_broker_by_default(refused_port: int) -> None:
    started = time.monotonic()
    with pytest.raises(errors.Unavailable, match=r"within 0\.5 s"):
        await Client(f"127.0.0.1:{refused_port}", connect_timeout=0.5).connect()
    assert time.monotonic() - started >= 0.45  # it kept trying (a broker may be starting)
    with pytest.raises(errors.Unavailable, match="connection refused"):
        await Client(f"127.0.0.1:{refused_port}", wait_for_broker=False).connect()


def _commands() -> Iterator[tuple[str, Any]]:
    def walk(command: Any, path: str) -> Iterator[tuple[str, Any]]:
        yield path, command
        for name, sub in (getattr(command, "commands", None) or {}).items():
            yield from walk(sub, f"{path} {name}".strip())

    yield from walk(typer.main.get_command(app), "")


def test_one_visible_option_name_per_parameter_across_commands() -> None:
    names: dict[str, set[str]] = defaultdict(set)
    for path, command in _commands():
        for p in command.params:
            if p.param_type_name == "option" and not getattr(p, "hidden", False):
                names[p.name].add(next(o for o in p.opts if o.startswith("--")) + f"  ({path})")
    clashes = {name: sorted(shown) for name, shown in names.items() if len({s.split()[0] for s in shown}) > 1}
    assert not clashes, clashes


def test_renamed_options_keep_their_old_names_hidden(tmp_path: Path) -> None:
    # pipeline export: -s is --service-addr as in produce/consume; --service-url still works.
    help_text = CliRunner().invoke(app, ["pipeline", "export", "--help"]).stdout
    assert "--service-addr" in help_text and "--service-url" not in help_text
    missing = CliRunner().invoke(app, ["pipeline", "export", "--topic", "/default/t", "--to", str(tmp_path)])
    assert missing.exit_code == 2 and "--service-addr" in missing.stderr
    for args in (
        ["admin", "topics", "subscriptions", "--help"],
        ["admin", "security", "tokens", "create", "--help"],
        ["admin", "security", "api-keys", "create", "--help"],
    ):
        shown = CliRunner().invoke(app, args).stdout
        assert "--partitions" not in shown and "--type " not in shown, shown
    params = {
        path: {o for p in command.params for o in p.opts}
        for path, command in _commands()
        if path in ("pipeline export", "admin topics subscriptions", "admin security tokens create")
    }
    assert "--service-url" in params["pipeline export"]
    assert {"--partition-map", "--partitions"} <= params["admin topics subscriptions"]
    assert {"--principal-type", "--type"} <= params["admin security tokens create"]
