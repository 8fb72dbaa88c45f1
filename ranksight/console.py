"""The one error line of every ranksight command, tool and benchmark script.

``error(message, code=2) -> int``
    Prints ``ranksight: error: MESSAGE`` to stderr and returns ``code``, the exit status the
    caller returns (a subcommand's ``run``, a script's ``main``).
``fail(message, code=2)``
    ``error`` that exits: raises ``SystemExit(code)`` after printing the line, for code deep in a
    script that has no status to return.
``ERROR_PREFIX``
    What every such line starts with (argparse's usage errors print it too, see ``ranksight.cli``).

It sits with the CLI in the contract (standard library only), so that the contract, the tools, the
agent, the generators and the benchmarks all print through it.
"""
from __future__ import annotations

import sys
from typing import NoReturn

ERROR_PREFIX = "ranksight: error: "


def error(message: str, code: int = 2) -> int:
    """Print the one error line (to stderr) and return ``code``, the exit status."""
    print(ERROR_PREFIX + message, file=sys.stderr)
    return code


def fail(message: str, code: int = 2) -> NoReturn:
    """Print the one error line and exit with ``code``."""
    raise SystemExit(error(message, code))
