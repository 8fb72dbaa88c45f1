"""The contract's errors, below every module that raises them (config, oncall) or catches them (cli)."""
from __future__ import annotations


class ConfigError(ValueError):
    """One clear line about a bad config value."""
