#!/usr/bin/env python3
"""The scale benchmark runner: same as `ranksight bench scale` (see bench/scale/).

    .venv/bin/python bench/scale/run.py --nodes 1024 --json > bench/scale/result.json
"""
from __future__ import annotations

import argparse
import logging
import sys

from ranksight.tools.bench import load

scale = load("scale")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="ranksight scale benchmark")
    scale.add_arguments(p)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return scale.run(args)


if __name__ == "__main__":
    sys.exit(main())
