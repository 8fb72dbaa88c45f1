"""`ranksight config`: print the effective config as YAML (and so validate it)."""
from __future__ import annotations

import argparse
import sys

import yaml

from .. import config


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="YAML config file (default: $RANKSIGHT_CONFIG)")
    p.add_argument("--profile", default="default", choices=sorted(config.PROFILES),
                   help="default, or test (short for: durations and windows for end-to-end tests)")
    p.add_argument("--describe", action="store_true", help="list every key with its default and what it drives")


def run(args: argparse.Namespace) -> int:
    if args.describe:
        for section, key, default, help_ in config.describe():
            print(f"{section}.{key} = {default!r}\n    {help_}")
        return 0
    cfg = config.load(args.config, args.profile)
    yaml.safe_dump(dict(cfg), sys.stdout, sort_keys=False)
    return 0
