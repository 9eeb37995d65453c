"""`ister --help` as a newcomer reads it: nothing in the help texts is eaten by the rich markup."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from ister.cli.main import app


@pytest.mark.parametrize("args", [["--help"], ["pipeline", "--help"]])
def test_spark_extra_is_spelled_out(args: list[str]) -> None:
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "pip install 'ister[spark]'" in result.output


def test_consume_help_names_the_topic_wait() -> None:
    result = CliRunner().invoke(app, ["consume", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "--timeout" in result.output and "wait for the topic" in result.output


def test_produce_help_says_it_is_idempotent() -> None:
    """docs/idempotence.md: the Ister client `ister produce` uses stores a retried batch once."""
    result = CliRunner().invoke(app, ["produce", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "Idempotent" in text and "stored once" in text, text
    assert "at-least-once, as the Ister client" not in text  # what --reliable's help said before
