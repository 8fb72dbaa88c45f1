#!/usr/bin/env python3
"""Thin wrapper: the same as `ranksight bench hooks [--json]` (see ranksight/hooks/bench.py)."""
import argparse
import sys

from ranksight.hooks import bench

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=bench.__doc__.splitlines()[0])
    bench.add_arguments(p)
    sys.exit(bench.run(p.parse_args()))
