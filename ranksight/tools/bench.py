"""`ranksight bench NAME ...`: run a benchmark of this checkout and print its numbers (JSON with --json).

A benchmark is a package ``bench/NAME/`` of the checkout (beside ``ranksight/``) whose
``__init__.py`` defines ``add_arguments(parser)`` and ``run(args) -> int``; the first line of
its docstring is its help. Adding one is adding that package: nothing here changes. The
benchmarks are not installed, so from an install without ``bench/`` the command says so in one
line (exit 2). ``load(NAME)`` imports one (as ``bench.NAME``) for scripts and tests.

``INSTALLED`` lists the other benchmarks: a module of an installed package, or a single-file
script of the checkout's ``bench/`` (a path from the repository root) with the same two functions.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Dict, Optional

from ..console import error

CHECKOUT_BENCH = Path(__file__).resolve().parents[2] / "bench"

# name -> (module or bench/ script path, help)
INSTALLED: Dict[str, tuple] = {
    "hooks": ("bench/bench_hooks.py", "host us per step of the hooks, by method, and their wall ratio on a 2-rank "
                                      "gloo DDP step (quick by default; --thorough)"),
    "exporter": ("bench/bench_exporter.py", "agent scrape p50/p99, CPU, RSS and max ingest rate"),
}


class NoBenchmark(ImportError):
    """One line: the benchmark is not in this checkout, or there is no checkout."""


def available() -> Dict[str, str]:
    """name -> help of every benchmark: bench/NAME/ packages of the checkout, then INSTALLED."""
    out: Dict[str, str] = {}
    if CHECKOUT_BENCH.is_dir():
        for d in sorted(CHECKOUT_BENCH.iterdir()):
            init = d / "__init__.py"
            if init.is_file():
                try:
                    doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
                except (OSError, SyntaxError, ValueError):
                    doc = ""
                out[d.name] = doc.strip().splitlines()[0] if doc.strip() else d.name
    for name, (_, help_) in INSTALLED.items():
        out.setdefault(name, help_)
    return out


def _bench_package() -> ModuleType:
    """The checkout's bench/ as the package ``bench`` (without putting the checkout on sys.path)."""
    mod = sys.modules.get("bench")
    if mod is not None and Path(getattr(mod, "__file__", "") or "").resolve().parent == CHECKOUT_BENCH:
        return mod
    init = CHECKOUT_BENCH / "__init__.py"
    if not init.is_file():
        raise NoBenchmark(f"the benchmarks live in a ranksight checkout's bench/ folder, not in the installed "
                          f"package ({CHECKOUT_BENCH} is missing): run them from a checkout (pip install -e .)")
    spec = importlib.util.spec_from_file_location("bench", init, submodule_search_locations=[str(CHECKOUT_BENCH)])
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench"] = mod
    spec.loader.exec_module(mod)
    return mod


def load(name: str) -> ModuleType:
    """The benchmark module for NAME: bench/NAME/ of the checkout, else an INSTALLED one.
    NoBenchmark (one line) when neither exists."""
    if (CHECKOUT_BENCH / name / "__init__.py").is_file():
        _bench_package()
        return importlib.import_module(f"bench.{name}")
    if name in INSTALLED:
        where = INSTALLED[name][0]
        if not where.endswith(".py"):
            return importlib.import_module(where)
        path = CHECKOUT_BENCH.parent / where  # a script of the checkout's bench/ folder
        if not path.is_file():
            raise NoBenchmark(f"{where} is missing: the benchmarks run from a ranksight checkout (pip install -e .)")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    _bench_package()  # says "no checkout" when that is why
    raise NoBenchmark(f"no benchmark {name!r} in {CHECKOUT_BENCH} (there: {', '.join(available()) or 'none'})")


def add_arguments(p: argparse.ArgumentParser) -> None:
    argv = sys.argv[sys.argv.index("bench") + 1:] if "bench" in sys.argv else []
    chosen: Optional[str] = next((a for a in argv if not a.startswith("-")), None)
    sub = p.add_subparsers(dest="bench", metavar="BENCH", parser_class=type(p))
    names = available()
    if chosen is not None and chosen not in names:
        try:
            load(chosen)
        except ImportError as e:
            p.error(str(e))
    for name, help_ in names.items():
        sp = sub.add_parser(name, help=help_, description=help_)
        if name != chosen:
            continue
        try:
            module = load(name)
        except ImportError as e:  # e.g. torch missing for the hooks benchmark
            p.error(f"benchmark {name} cannot run here: {e}")
        module.add_arguments(sp)
        sp.set_defaults(_bench_run=module.run)


def _load(mod: str):
    """A module by name, or a script of the checkout's bench/ folder by its path from the repository root."""
    if not mod.endswith(".py"):
        return importlib.import_module(mod)
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / mod
    if not path.exists():
        raise ImportError(f"{mod} is not here (the benchmarks run from a checkout)")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def run(args: argparse.Namespace) -> int:
    fn = getattr(args, "_bench_run", None)
    if fn is None:
        return error("name a benchmark: " + ", ".join(available()))
    return int(fn(args) or 0)
