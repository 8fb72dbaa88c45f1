"""`ranksight exporter`: the node agent.

Serves /metrics, /healthz and /api/v1/ranks (and POST /api/v1/ranks/end for `ranksight act`
where agent.act_token_file or agent.act_client_sans enables it: exporter/workers.py), receives
the hooks' datagrams (rank ingest, heartbeats, stalls) and runs the gpu, network, rdma and disk
collectors.
Every flag overrides the matching key of the config's ``agent`` section.
"""
from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import socket
import threading
from pathlib import Path
from typing import List, Optional, Tuple

from ranksight import config as cfgmod
from ranksight.config import ConfigError
from ranksight.address import parse_address
from ranksight.console import error

from .agent import COLLECTORS, Agent, AgentError, AgentSettings, parse_listen
from .ranks import RankSettings
from .webconfig import WebConfig, WebConfigError
from .webconfig import load as load_web_config

log = logging.getLogger("ranksight.exporter")


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = cfgmod.SCHEMA["agent"]
    p.add_argument("--listen", metavar="HOST:PORT",
                   help=f"address of the HTTP server for /metrics and /healthz (agent.listen; default {d['listen'].default})")
    p.add_argument("--ingest", metavar="URL",
                   help="where the hooks' datagrams arrive: udp://HOST:PORT or unix:///PATH "
                        f"(agent.ingest; default {d['ingest'].default})")
    p.add_argument("--procfs", metavar="DIR", help="procfs root the collectors read (agent.procfs; default /proc)")
    p.add_argument("--sysfs", metavar="DIR", help="sysfs root the collectors read (agent.sysfs; default /sys)")
    p.add_argument("--watch-path", metavar="PATH", action="append", default=None, dest="watch_path",
                   help="also report free/total bytes of the filesystem under PATH; repeatable "
                        "(added to agent.watch_paths; the temp dir and the dirs ranks report are always watched)")
    p.add_argument("--collectors", metavar="LIST",
                   help=f"comma-separated collectors to enable, from {','.join(COLLECTORS)} "
                        f"(agent.collectors; default all). 'ranks' is the datagram ingest")
    p.add_argument("--config", metavar="FILE", help="YAML config file (else $RANKSIGHT_CONFIG; env RANKSIGHT__agent__KEY overrides)")
    p.add_argument("--profile", default="default", choices=sorted(cfgmod.PROFILES),
                   help="config profile (test shortens alert durations and windows; default: default)")
    p.add_argument("--web.config.file", metavar="FILE", dest="web_config_file",
                   help="exporter-toolkit web config (as node_exporter's): TLS, client certificates, basic auth "
                        "with bcrypt hashes, headers; it covers every path, /healthz too "
                        "(agent.web_config_file; default none: plain HTTP, no auth)")
    p.add_argument("--node", metavar="NAME", help="value of the node label on node and GPU series (default: the hostname)")


def settings_from(args: argparse.Namespace) -> AgentSettings:
    """Config file + profile + env, then flags. Raises ConfigError with one line."""
    cfg = cfgmod.load(args.config, args.profile)
    a = dict(cfg["agent"])
    for key in ("listen", "ingest", "procfs", "sysfs", "collectors", "web_config_file"):
        v = getattr(args, key, None)
        if v is not None:
            a[key] = v
    try:
        parse_listen(a["listen"])
        parse_address(a["ingest"], listen=True)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    for key in ("procfs", "sysfs"):
        if not os.path.isdir(a[key]):
            raise ConfigError(f"{key} root {a[key]!r} is not a directory")
    names = [c.strip() for c in a["collectors"].split(",") if c.strip()]
    unknown = [c for c in names if c not in COLLECTORS]
    if unknown or not names:
        raise ConfigError(f"collectors {a['collectors']!r}: expected a comma-separated list from {','.join(COLLECTORS)}")
    for key in ("nic_include", "nic_exclude"):
        try:
            re.compile(a[key])
        except re.error as e:
            raise ConfigError(f"config agent.{key}: bad regular expression: {e}") from None
    web = None
    if a["web_config_file"]:
        try:
            web = load_web_config(a["web_config_file"])
        except WebConfigError as e:
            raise ConfigError(str(e)) from None
    token, sans = _act_access(a, web)
    watch: List[str] = list(a["watch_paths"]) + list(args.watch_path or [])
    t = cfg["thresholds"]
    if t["gpu_swing_low"] >= t["gpu_swing_high"]:
        raise ConfigError("config thresholds.gpu_swing_low must be below thresholds.gpu_swing_high")
    return AgentSettings(
        node=args.node or socket.gethostname(),
        listen=a["listen"],
        ingest=a["ingest"],
        procfs=a["procfs"],
        sysfs=a["sysfs"],
        collectors=tuple(dict.fromkeys(names)),
        watch_paths=watch,
        ranks=RankSettings.from_config(a),
        gpu_poll_seconds=a["gpu_poll_seconds"],
        gpu_state_seconds=a["gpu_state_seconds"],
        gpu_window_seconds=a["gpu_window_seconds"],
        gpu_swing_high=t["gpu_swing_high"],
        gpu_swing_low=t["gpu_swing_low"],
        nic_include=a["nic_include"],
        nic_exclude=a["nic_exclude"],
        rdma_counters=a["rdma_counters"],
        peak_flops_dtype=a["peak_flops_dtype"],
        peak_tflops=a["peak_tflops"],
        peak_tflops_by_name=a["peak_tflops_by_name"],
        web_config=web,
        act_token=token,
        act_client_sans=sans,
    )


def _act_access(a: dict, web: Optional[WebConfig]) -> Tuple[Optional[bytes], Optional[List[str]]]:
    """agent.act_token_file's token and agent.act_client_sans (None: not configured). ConfigError otherwise."""
    token = None
    if a["act_token_file"]:
        try:
            token = Path(a["act_token_file"]).read_text(encoding="utf-8").strip().encode()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"config agent.act_token_file: cannot read {a['act_token_file']}: "
                              f"{getattr(e, 'strerror', None) or e}") from None
        if not token:
            raise ConfigError(f"config agent.act_token_file: {a['act_token_file']} is empty")
    sans = [x.strip() for x in a["act_client_sans"] if x.strip()] or None
    if sans is not None and (web is None or web.tls is None or web.tls.client_auth_type == "NoClientCert"):
        raise ConfigError("config agent.act_client_sans: needs --web.config.file (agent.web_config_file) with "
                          "tls_server_config client_auth_type RequireAndVerifyClientCert")
    return token, sans


def serve(settings: AgentSettings, nvml: Optional[object] = None, stop: Optional[threading.Event] = None) -> int:
    """Run the agent until SIGTERM/SIGINT (or ``stop``). Returns the exit code."""
    agent = Agent(settings, nvml=nvml)
    try:
        agent.start()
    except AgentError as e:
        return error(str(e))
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    try:
        while not stop.wait(1.0):
            pass
    finally:
        log.info("stopping")
        agent.stop()
    return 0


def run(args: argparse.Namespace) -> int:
    return serve(settings_from(args))
