"""`ranksight` command line: one entry point, subcommands.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and
``run(args) -> int``. Bad usage exits 2 with one clear line; runtime errors that
are the user's (config, ports, unreachable Prometheus) also print one line and
exit 2. Every such line starts with ``ERROR_PREFIX``: subcommands print it with
``error(message)`` (both from ``ranksight.console``, which the tools, the agent and the benchmarks use too).

The generators (``rules``, ``dashboards``, ``k8s``) share their output options here
(``add_output_arguments``, ``output_dir``): they write to ``--out DIR``, by default
``./run/<name>`` under the current directory, and into the checkout's committed files only
with ``--in-place``, which renders nothing but the built-in defaults.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import os
import sys
from pathlib import Path
from typing import Any, List, Mapping, Optional, Sequence, Tuple

from . import __version__
from .console import ERROR_PREFIX, error
from .config import ConfigError


# ------------------------------------------------------------------ the generators' output folder
# Where `ranksight rules|dashboards|k8s` write without --out: run/<name> under the current
# directory, beside `ranksight stack`'s run/stack (run/ is git-ignored at a checkout's root).
RUN_ROOT = Path("run")


class OutputError(Exception):
    """One line about --out or --in-place; the generator prints it with error() (exit 2)."""


def _checkout_root(committed: Path) -> Optional[Path]:
    """The checkout holding a committed folder (alerts/, dashboards/, deploy/kubernetes/): the
    folder above this package when it has the pyproject.toml, as an editable install does. An
    installed package has none, and no committed files to refresh."""
    root = Path(__file__).resolve().parents[1]
    if (root / "pyproject.toml").is_file() and root in committed.resolve().parents:
        return root
    return None


def committed_label(committed: Path) -> str:
    """alerts/, dashboards/ or deploy/kubernetes/: the committed folder as the README names it."""
    root = _checkout_root(committed)
    return (committed.relative_to(root).as_posix() if root else str(committed)) + "/"


def add_output_arguments(p: argparse.ArgumentParser, name: str, committed: Path) -> None:
    """--out DIR (default ./run/NAME) and --in-place (the committed folder of this checkout)."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--out", metavar="DIR", type=Path, default=None,
                   help=f"output folder (default: ./{RUN_ROOT / name}, under the current directory)")
    g.add_argument("--in-place", action="store_true",
                   help=f"write this checkout's committed {committed_label(committed)} instead: only the render "
                        "of the built-in defaults, which is what they hold")


def departures(cfg: Mapping[str, Any], args: Any, flags: Sequence[Tuple[str, Any, Any]] = ()) -> List[str]:
    """What makes this render differ from the committed one: flags given as (flag, value, default)
    that are not at their default, then each config key whose effective value is not the built-in
    default, with where it came from."""
    from . import config

    out = [f"{flag} {value}" for flag, value, default in flags if value != default]
    if out:
        return out
    base = config.load(None, "default", env={})
    env = {k.lower(): k for k in os.environ if k.startswith("RANKSIGHT__")}
    for section, keys in cfg.items():
        for key, value in keys.items():
            if value == base[section][key]:
                continue
            source = env.get(f"ranksight__{section}__{key}".lower())
            if not source and getattr(args, "config", None):
                source = f"--config {args.config}"
            elif not source:
                source = f"$RANKSIGHT_CONFIG {os.environ.get('RANKSIGHT_CONFIG', '')}".rstrip()
            out.append(f"{section}.{key}={value} from {source}")
    return out


def write_file(path: Path, text: str) -> None:
    """Write a generated file whole or not at all: a sibling ``.tmp`` renamed over it, its folder
    created. The one writer of ``rules``, ``dashboards`` and ``k8s``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def output_dir(args: Any, name: str, committed: Path, differs: Sequence[str] = (), check: bool = False) -> Path:
    """The folder a generator writes into (with check=True: compares against, creating nothing):
    --out, else the committed folder with --in-place, else ./run/NAME. ``differs`` is departures():
    the committed folder takes only the defaults' render. Raises OutputError (one line)."""
    label = committed_label(committed)
    if getattr(args, "in_place", False):
        if _checkout_root(committed) is None:
            raise OutputError(f"--in-place: {committed} is not in a ranksight checkout (an installed "
                              "package has no committed files); write with --out DIR")
        out, flag = committed, "--in-place"
    else:
        out = args.out if args.out is not None else RUN_ROOT / name
        flag = f"--out {out}"
    if differs and out.resolve() == committed.resolve():
        shown = ", ".join(differs[:3]) + (", ..." if len(differs) > 3 else "")
        raise OutputError(f"{flag}: the committed {label} is the render of the built-in defaults, "
                          f"not of {shown}; write this render elsewhere with --out DIR")
    if out.exists() and not out.is_dir():
        raise OutputError(f"{flag}: {out} is not a directory")
    if check:
        return out
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"{flag}: cannot create {out}: {e.strerror or e}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise OutputError(f"{flag}: {out} is not writable")
    return out


# name -> (module, one-line help)
SUBCOMMANDS = {
    "exporter": ("ranksight.exporter.main", "run the node agent: rank ingest, heartbeats, GPU/network/RDMA/disk collectors"),
    "rules": ("ranksight.alerts.generate", "write alert and recording rules, Alertmanager config and runbooks"),
    "dashboards": ("ranksight.dashboards.generate", "write the Grafana dashboards"),
    "k8s": ("ranksight.tools.k8s", "write the Kubernetes manifests (agent DaemonSet, ServiceMonitor, PrometheusRule, "
                                    "AlertmanagerConfig, dashboard ConfigMaps)"),
    "stack": ("ranksight.tools.stack", "start/stop a local Prometheus + Alertmanager (Debian binaries, no Docker)"),
    "demo": ("ranksight.tools.demo", "run the agent, the local stack and an instrumented 2-rank CPU DDP job"),
    "triage": ("ranksight.tools.triage_cli", "walk the six triage checks against Prometheus and name the first cause"),
    "report": ("ranksight.report.cli", "write a run report (HTML, Markdown, PNGs of the dashboards' panels) from Prometheus"),
    "bench": ("ranksight.tools.bench", "run the benchmarks (hooks, exporter, scale) and print JSON"),
    "act": ("ranksight.tools.act", "act on each alert's verdict (restart a hung job's workers, drain a node): "
                                    "an Alertmanager webhook receiver, propose or auto per verdict, dry run by default"),
    "config": ("ranksight.tools.config_cli", "print the effective config (validates it)"),
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one clear line, exit 2
        self.exit(2, f"{ERROR_PREFIX}{message} (see '{self.prog} --help')\n")


def _selected(argv: List[str], names) -> Optional[str]:
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a == "--log-level":
            skip = True
        elif not a.startswith("-"):
            return a if a in names else None
    return None


def build_parser(argv: Optional[List[str]] = None) -> argparse.ArgumentParser:
    """Only the chosen subcommand's module is imported, so `ranksight exporter` never
    pulls in torch (or anything else another subcommand needs)."""
    argv = sys.argv[1:] if argv is None else argv
    chosen = _selected(argv, SUBCOMMANDS)
    p = _Parser(prog="ranksight", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"ranksight {__version__}")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="logging level (default info)")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=_Parser)
    for name, (mod, help_) in SUBCOMMANDS.items():
        if name != chosen:
            if importlib.util.find_spec(mod) is not None:
                sub.add_parser(name, help=help_, description=help_)
            continue
        module = importlib.import_module(mod)
        sp = sub.add_parser(name, help=help_, description=help_)
        module.add_arguments(sp)
        sp.set_defaults(_run=module.run)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    logging.basicConfig(level=getattr(logging, args.log_level.upper()),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not getattr(args, "_run", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args._run(args) or 0)
    except ConfigError as e:
        return error(str(e))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `ranksight config | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
