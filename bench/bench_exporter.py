#!/usr/bin/env python3
"""Thin wrapper: the same as `ranksight bench exporter [--json]` (see exporter/bench.py)."""
import sys

from ranksight.exporter import bench

if __name__ == "__main__":
    sys.exit(bench.main())
