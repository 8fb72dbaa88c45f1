"""The config sections the hooks read (``hooks``; the lints' ``lints`` and ``thresholds``), from
``ranksight.config`` only: its defaults, its validation. A bad value never reaches the training
loop: one log line, and the default."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, fields
from typing import Any, Dict, Mapping, Optional, Sequence

from ranksight import config as rs_config
from ranksight.address import Address, parse_address

log = logging.getLogger("ranksight.hooks")


def sections(config: Any, names: Sequence[str], *, who: str = "the hooks", quiet_load: bool = False,
             keys: Optional[Mapping[str, Sequence[str]]] = None) -> Dict[str, Dict[str, Any]]:
    """``{section: {key: validated value}}`` for ``names``. ``config``: a path (None:
    ``RANKSIGHT_CONFIG`` and ``RANKSIGHT__<section>__<key>``) or a dict with sections (what it
    lacks is the default). A config that cannot be loaded gives the defaults, with one warning
    (``quiet_load``: a debug line, for a second reader of a config already reported). ``keys``:
    only these keys of a section (default: all of them)."""
    d = rs_config.defaults()
    if isinstance(config, Mapping):
        raw = {n: dict(d[n], **(config.get(n) or {})) for n in names}
    else:
        level = logging.DEBUG if quiet_load else logging.WARNING
        try:
            cfg = rs_config.load(config)
            raw = {n: dict(cfg[n]) for n in names}
        except rs_config.ConfigError as e:
            log.log(level, "ranksight: %s; %s use the built-in defaults", e, who)
            raw = {n: dict(d[n]) for n in names}
        except Exception as e:  # never let config trouble stop training
            log.log(level, "ranksight: cannot load the config (%s); %s use the built-in defaults", e, who)
            raw = {n: dict(d[n]) for n in names}
    out: Dict[str, Dict[str, Any]] = {}
    for n in names:
        sec: Dict[str, Any] = {}
        for k in (keys or {}).get(n, d[n]):
            dv = d[n][k]
            try:
                sec[k] = rs_config.validate(n, k, raw[n].get(k, dv))
            except rs_config.ConfigError as e:
                log.warning("ranksight: %s; using the default %r", e, dv)
                sec[k] = dv
        out[n] = sec
    return out


@dataclass(frozen=True)
class Settings:
    """The ``hooks`` config section, typed; built by ``load_settings`` from ``ranksight.config``
    (its defaults and validation), so no default is written here."""

    agent: Address
    heartbeat_seconds: float
    table_every_steps: int
    table_every_seconds: float
    max_pending_events: int
    patch_torch_save: bool
    checkpoint_dir: str
    log_dir: str
    ddp_stats_every: int
    table_min_seconds: float
    table_share_move: float
    stack_after_seconds: float  # no progress this long: send the main thread's stack (hooks/stack.py)
    stack_every_seconds: float


def load_settings(config: Any = None, agent: Optional[str] = None) -> Settings:
    """The hooks section of the config (``RANKSIGHT_CONFIG``, ``RANKSIGHT__hooks__*``) and
    ``RANKSIGHT_AGENT``. A bad value never reaches the training loop: one log line, defaults."""
    defaults = rs_config.defaults()["hooks"]
    checked = sections(config, ("hooks",))["hooks"]
    spec = agent if agent is not None else os.environ.get("RANKSIGHT_AGENT") or checked["agent"]
    try:
        addr = parse_address(spec)
    except ValueError as e:
        log.warning("ranksight: %s; sending to the default %s", e, defaults["agent"])
        addr = parse_address(defaults["agent"])
    kw = {f.name: type(defaults[f.name])(checked[f.name]) for f in fields(Settings) if f.name != "agent"}
    return Settings(agent=addr, **kw)
