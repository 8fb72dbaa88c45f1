"""The config sections the hooks read (``hooks``; the lints' ``lints`` and ``thresholds``), with
``ranksight.config``'s schema, defaults and validation, in its load order: defaults, the YAML file
(``RANKSIGHT_CONFIG`` or a path), the ``RANKSIGHT__<section>__<key>`` environment.

The agent and the rule generator refuse a config with any bad entry; inside a training process a
bad entry costs only itself. Each one (an unknown key, a bad value, an unknown section, a
malformed variable name) is one warning line that names it and what is wrong, and is skipped;
every other entry still applies. A file that cannot be read or parsed costs its own entries, and
the environment still applies. Nothing here raises into the training loop."""
from __future__ import annotations

import difflib
import logging
import os
from dataclasses import dataclass, fields
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from ranksight import config as rs_config
from ranksight.address import Address, parse_address

log = logging.getLogger("ranksight.hooks")

ENV_PREFIX = "RANKSIGHT__"
SKIPPED = "ignored, the other settings apply"

# one entry of a config layer: (origin, section, key, value); origin names it in a warning
Entry = Tuple[str, str, str, Any]


def _layer(origin: str, data: Any, problems: List[str]) -> Iterator[Entry]:
    """The entries of one mapping of sections (a YAML file, a dict given to ``watch()``)."""
    if not isinstance(data, Mapping):
        problems.append(f"{origin}: expected a mapping of sections, got {type(data).__name__}; {SKIPPED}")
        return
    for section, vals in data.items():
        if vals is None:  # "hooks:" with nothing under it
            continue
        if not isinstance(vals, Mapping):
            problems.append(f"{origin}: section {section!r} must be a mapping; {SKIPPED}")
            continue
        for key, value in vals.items():
            yield origin, str(section), str(key), value


def _file(path: str, problems: List[str]) -> Iterator[Entry]:
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as e:
        problems.append(f"config {path}: cannot read: {e.strerror or e}; its settings are ignored")
        return
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        problems.append(f"config {path}: invalid YAML{at}; its settings are ignored")
        return
    if data is not None:
        yield from _layer(f"config {path}", data, problems)


def _env(env: Mapping[str, str], problems: List[str]) -> Iterator[Entry]:
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX):
            continue
        parts = name[len(ENV_PREFIX):].split("__")
        if len(parts) != 2 or not all(parts):
            problems.append(f"env {name}: expected {ENV_PREFIX}<section>__<key>; {SKIPPED}")
            continue
        yield f"env {name}", parts[0].lower(), parts[1].lower(), value


def entries(config: Any, env: Mapping[str, str], problems: List[str]) -> List[Entry]:
    """Every entry in load order (a later one wins): a dict's alone; else the file's
    (``config`` as a path, or ``RANKSIGHT_CONFIG``), then the environment's. What is wrong with
    the whole of a layer is appended to ``problems``."""
    if isinstance(config, Mapping):
        return list(_layer("config", config, problems))
    out: List[Entry] = []
    path = config or env.get("RANKSIGHT_CONFIG") or None
    if path:
        out.extend(_file(str(path), problems))
    out.extend(_env(env, problems))
    return out


def _unknown_key(origin: str, section: str, key: str) -> str:
    near = difflib.get_close_matches(key, rs_config.SCHEMA[section], n=1)
    hint = f" (did you mean {near[0]}?)" if near else ""
    return f"{origin}: unknown key {section}.{key}{hint}; {SKIPPED}"


def _bad_value(origin: str, section: str, key: str, e: rs_config.ConfigError, using: Any, default: Any) -> str:
    msg = str(e)
    prefix = f"config {section}.{key}: "
    msg = msg[len(prefix):] if msg.startswith(prefix) else msg
    what = "" if origin.startswith("env ") else f" {section}.{key}:"  # (a variable's name says which)
    keep = f"using the default {using!r}" if using == default else f"keeping {using!r}"
    return f"{origin}:{what} {msg}; {keep}"


def sections(config: Any, names: Sequence[str], *, who: str = "the hooks", quiet_load: bool = False,
             keys: Optional[Mapping[str, Sequence[str]]] = None,
             env: Optional[Mapping[str, str]] = None) -> Dict[str, Dict[str, Any]]:
    """``{section: {key: validated value}}`` for ``names``. ``config``: a path (None:
    ``RANKSIGHT_CONFIG``) plus the ``RANKSIGHT__<section>__<key>`` environment (``env``, default
    ``os.environ``), or a dict with sections (what it lacks is the default). ``keys``: only these
    keys of a section (default: all of them).

    An entry of these sections that is unknown or bad is one warning and is skipped (a bad value
    keeps what the earlier layers gave). What concerns no one section (a file that cannot be read,
    an unknown section, a malformed variable name) is one warning too, or a debug line with
    ``quiet_load`` (a second reader of a config already reported)."""
    env = os.environ if env is None else env
    level = logging.DEBUG if quiet_load else logging.WARNING
    d = rs_config.defaults()
    out = {n: {k: d[n][k] for k in (keys or {}).get(n, d[n])} for n in names}
    try:
        problems: List[str] = []
        for origin, section, key, value in entries(config, env, problems):
            if section not in rs_config.SCHEMA:
                problems.append(f"{origin}: unknown section {section!r} (known: {', '.join(rs_config.SCHEMA)}); "
                                f"{SKIPPED}")
            elif section not in out:
                continue  # another reader's
            elif key not in rs_config.SCHEMA[section]:
                log.warning("ranksight: %s", _unknown_key(origin, section, key))
            elif key in out[section]:
                try:
                    out[section][key] = rs_config.validate(section, key, value)
                except rs_config.ConfigError as e:
                    line = _bad_value(origin, section, key, e, out[section][key], d[section][key])
                    log.warning("ranksight: %s", line)
        for p in dict.fromkeys(problems):  # (an unknown section of a file: once, not once per key)
            log.log(level, "ranksight: %s", p)
    except Exception as e:  # never let config trouble stop training
        log.log(level, "ranksight: cannot load the config (%s: %s); %s use the built-in defaults",
                type(e).__name__, e, who)
        out = {n: {k: d[n][k] for k in (keys or {}).get(n, d[n])} for n in names}
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
    gpu_timing_every: int  # CUDA: one step in N on average timed with events (hooks/timing.py, sampled timing)
    gpu_timing_seconds: float  # ... and one at least this often
    gpu_timing_budget: float  # gpu_timing_every 0: N keeps the events' host cost under this share of the step
    patch_torch_save: bool
    checkpoint_dir: str
    log_dir: str
    ddp_stats_every: int
    table_min_seconds: float
    table_share_move: float
    stack_after_seconds: float  # no progress this long: send the main thread's stack (hooks/stack.py)
    stack_every_seconds: float
    memory_peak_seconds: float  # the CUDA allocator's peak window (hooks/memory.py); 0: never reset
    protocol: int  # the datagram protocol version sent (ranksight.protocol.SENDABLE)
    step_detail: bool  # "steps" records carry every per-step list (protocol 3 to 5; 2 always does)
    tokens_per_sample: int  # 0: from the batch's token tensor (hooks/work.py)
    flops_per_token: int  # 0: estimated once from the model (hooks/flops.py)
    total_steps: int  # 0: unknown (watch(total_steps=) and the framework callbacks set Watcher.total_steps)


def load_settings(config: Any = None, agent: Optional[str] = None) -> Settings:
    """The hooks section of the config (``RANKSIGHT_CONFIG``, ``RANKSIGHT__hooks__*``) and
    ``RANKSIGHT_AGENT``. A bad entry costs only itself: one warning line, and the value the
    other layers (or the default) give."""
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
