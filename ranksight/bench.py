"""`ranksight bench hooks|exporter|scale`: run a benchmark and print its numbers (JSON with --json).

Each benchmark exposes ``add_arguments(parser)`` and ``run(args) -> int``: a module beside the
code it measures, or a file under ``bench/`` of a checkout (a path ending in ``.py``).
"""
from __future__ import annotations

import argparse
import importlib

from .cli import error

BENCHES = {
    "hooks": ("bench/bench_hooks.py", "host us per step and wall ratio of the hooks on a 2-rank gloo DDP step"),
    "exporter": ("ranksight.exporter.bench", "agent scrape p50/p99, CPU, RSS and max ingest rate"),
    "scale": ("ranksight.scale", "1,024 nodes x 8 GPUs backfilled into a real Prometheus: dashboard query times"),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    import sys

    argv = sys.argv[sys.argv.index("bench") + 1:] if "bench" in sys.argv else []
    chosen = next((a for a in argv if not a.startswith("-")), None)
    sub = p.add_subparsers(dest="bench", metavar="BENCH", parser_class=type(p))
    for name, (mod, help_) in BENCHES.items():
        if name != chosen:
            sub.add_parser(name, help=help_, description=help_)
            continue
        try:
            module = _load(mod)
        except ImportError as e:  # e.g. torch missing for the hooks benchmark
            p.error(f"benchmark {name} cannot run here: {e}")
        sp = sub.add_parser(name, help=help_, description=help_)
        module.add_arguments(sp)
        sp.set_defaults(_bench_run=module.run)


def _load(mod: str):
    """A module by name, or a benchmark file of the checkout this package runs from."""
    if not mod.endswith(".py"):
        return importlib.import_module(mod)
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / mod
    if not path.is_file():
        raise ImportError(f"{mod} ships with a checkout of the repository, not with the package")
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def run(args: argparse.Namespace) -> int:
    fn = getattr(args, "_bench_run", None)
    if fn is None:
        return error("name a benchmark: " + ", ".join(BENCHES))
    return int(fn(args) or 0)
