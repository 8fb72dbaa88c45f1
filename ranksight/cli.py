"""`ranksight` command line: one entry point, subcommands.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and
``run(args) -> int``. Bad usage exits 2 with one clear line; runtime errors that
are the user's (config, ports, unreachable Prometheus) also print one line and
exit 2. Every such line starts with ``ERROR_PREFIX``: subcommands print it with
``error(message)``.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import sys
from typing import List, Optional

from . import __version__
from .config import ConfigError

ERROR_PREFIX = "ranksight: error: "


def error(message: str, code: int = 2) -> int:
    """Print the one error line of a subcommand (to stderr) and return its exit status."""
    print(ERROR_PREFIX + message, file=sys.stderr)
    return code


# name -> (module, one-line help)
SUBCOMMANDS = {
    "exporter": ("ranksight.exporter.main", "run the node agent: rank ingest, heartbeats, GPU/network/RDMA/disk collectors"),
    "rules": ("ranksight.alerts.generate", "write alert and recording rules, Alertmanager config and runbooks"),
    "dashboards": ("ranksight.dashboards.generate", "write the Grafana dashboards"),
    "k8s": ("ranksight.k8s", "write the Kubernetes manifests (agent DaemonSet, ServiceMonitor, PrometheusRule, "
                                    "AlertmanagerConfig, dashboard ConfigMaps)"),
    "stack": ("ranksight.tools.stack", "start/stop a local Prometheus + Alertmanager (Debian binaries, no Docker)"),
    "demo": ("ranksight.tools.demo", "run the agent, the local stack and an instrumented 2-rank CPU DDP job"),
    "triage": ("ranksight.tools.triage_cli", "walk the six triage checks against Prometheus and name the first cause"),
    "report": ("ranksight.report.cli", "write a run report (HTML, Markdown, PNGs of the dashboards' panels) from Prometheus"),
    "bench": ("ranksight.bench", "run the benchmarks (hooks, exporter, scale) and print JSON"),
    "config": ("ranksight.config_cli", "print the effective config (validates it)"),
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
