"""`ranksight bench hooks|exporter|scale`: run a benchmark and print its numbers (JSON with --json).

Each benchmark lives beside the code it measures and exposes
``add_arguments(parser)`` and ``run(args) -> int``.
"""
from __future__ import annotations

import argparse
import importlib.util

from .cli import error

BENCHES = {
    "hooks": ("ranksight.hooks.bench", "host us per step and wall ratio of the hooks on a 2-rank gloo DDP step"),
    "exporter": ("bench/bench_exporter.py", "agent scrape p50/p99, CPU, RSS and max ingest rate"),
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
    """A module by name, or a script of the checkout's bench/ folder by its path from the repository root."""
    if not mod.endswith(".py"):
        return importlib.import_module(mod)
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / mod
    if not path.exists():
        raise ImportError(f"{mod} is not here (the benchmarks run from a checkout)")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def run(args: argparse.Namespace) -> int:
    fn = getattr(args, "_bench_run", None)
    if fn is None:
        return error("name a benchmark: " + ", ".join(BENCHES))
    return int(fn(args) or 0)
