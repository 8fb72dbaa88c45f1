"""ranksight.console: one line on stderr, the exit status returned or raised."""
from __future__ import annotations

import pytest

from ranksight import cli, console


def test_error_prints_one_line_and_returns_the_status(capsys):
    assert console.error("bad --thing") == 2
    assert console.error("it failed", 1) == 1
    out, err = capsys.readouterr()
    assert out == "" and err == "ranksight: error: bad --thing\nranksight: error: it failed\n"


def test_fail_exits_with_the_status(capsys):
    with pytest.raises(SystemExit) as e:
        console.fail("no trace", 1)
    assert e.value.code == 1 and capsys.readouterr().err == "ranksight: error: no trace\n"


def test_usage_errors_start_the_same_way(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["no-such-command"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and err[0].startswith(console.ERROR_PREFIX), err
