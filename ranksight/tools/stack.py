"""`ranksight stack up|down|status`: a local Prometheus + Alertmanager without Docker.

It runs Debian's ``/usr/bin/prometheus`` and ``/usr/bin/prometheus-alertmanager`` on
loopback with their data in a run directory (default ``./run/stack``). Prometheus
gets a copy of ``deploy/prometheus.yml`` rendered with the local targets, ports and
rules path; the rules and ``alertmanager.yml`` are rendered from the triage table
(``ranksight.alerts.generate.render``) for the chosen profile into the run directory, never
into the checkout's committed ``alerts/``.
``up`` daemonizes (pid files in the run dir), waits for both ``/-/ready`` and prints the URLs
and the shortest command that stops them from the current directory (``stack_command``);
``down`` stops them (TERM, then KILL after 10 s); ``status`` says what runs
(exit 0 all running, 1 partly, 3 nothing). Without ``--run-dir`` each acts on ``./run/stack``.

Python API (tests/conftest.py, tests/e2e and ``ranksight demo`` build on it; torch-free):

``find_binary(name) -> str``, ``MissingBinary``
    From ``ranksight.common.servers``, which starts Prometheus and Alertmanager for LocalStack.
``render_prometheus_config(template, targets, alertmanager, rule_glob, scrape_interval, evaluation_interval,
                          scrape_options=None) -> str``
    deploy/prometheus.yml with local targets, Alertmanager address and rules path; ``scrape_options``
    (``scheme``, ``tls_config``, ``basic_auth``, ...) are set on the agents' scrape job, for agents
    started with ``--web.config.file``.
``LocalStack(run_dir, targets=[...], cfg=None, files=None, prometheus_port=0, alertmanager_port=0,
             scrape_interval="5s", evaluation_interval=None, daemon=False, scrape_options=None)``
    ``files`` maps names to text like ``render(cfg)``: every top-level ``*.yml`` but
    ``alertmanager*.yml`` is a rule file, ``templates/*.tmpl`` go beside alertmanager.yml;
    missing parts are rendered from ``cfg`` (default: the default profile). Port 0 picks a free port.
    ``start(timeout=30)`` (starts both and waits ready; ``StackError`` with one line if
    not), ``stop()``, ``wait_ready(timeout)``, ``prom_url``, ``am_url``, ``prom``
    (``PrometheusAPI``), ``am`` (``AlertmanagerAPI``), ``pids()``, ``set_targets(targets)``
    (re-render + /-/reload, waits until applied), context manager.
    With ``daemon=False`` (tests, demo) the processes die with their parent (PDEATHSIG).
    ``owner``: who started it, when not ``stack up`` (saved in stack.json; ``status`` and
    ``down`` name it: ``ranksight demo --keep`` waits for ``down`` and then exits).
``AgentProcess(log_dir, listen_port=0, ingest_port=0, collectors=None, env=None, args=())``
    A real ``ranksight exporter`` subprocess on loopback (config through
    ``RANKSIGHT__agent__*`` env overrides). ``start(timeout)``, ``stop()``, ``target``
    ("127.0.0.1:PORT", to scrape), ``url``, ``ingest`` ("udp://127.0.0.1:PORT", for the
    hooks' ``RANKSIGHT_AGENT``), ``metrics_text()``, ``pid``.
The ports, processes, waits and the Prometheus/Alertmanager clients (``free_port``, ``Proc``,
``wait_until``, ``PrometheusAPI``, ``AlertmanagerAPI``) live in ``ranksight.common.plumbing``, the
Prometheus and Alertmanager processes in ``ranksight.common.servers``; import them from there.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shlex
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

from .. import config
from ..common import servers
from ..common.plumbing import (AlertmanagerAPI, ApiError, Proc, PrometheusAPI, free_port, http_get, last_line, port_in_use,
                               wait_http, wait_until)
from ..common.servers import MissingBinary, ServerError, find_binary
from ..console import error
from . import vmstack
from .stack_files import (ALERTMANAGER_FILE, TEMPLATES_DIR, deploy_dir, render_alert_files,  # noqa: F401 (public here)
                          render_prometheus_config)

log = logging.getLogger(__name__)

RULES_FILE = "ranksight-rules.yml"
DEFAULT_TARGET = "127.0.0.1:9945"
DEFAULT_RUN_DIR = "run/stack"  # relative to the current directory
DEFAULT_PROMETHEUS_PORT = 9090
DEFAULT_ALERTMANAGER_PORT = 9093


StackError = ServerError  # one clear line for the user; the CLI prints it and exits 2 (MissingBinary is one)


# ------------------------------------------------------------------ small helpers
def parse_targets(text: str) -> List[str]:
    """'host:port,host:port' -> list; StackError (one line) on a bad entry."""
    out = []
    for t in (p.strip() for p in text.split(",")):
        if not t:
            continue
        m = re.fullmatch(r"(\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.-]+):(\d{1,5})", t)
        if not m or not 0 < int(m.group(2)) < 65536:
            raise StackError(f"bad target {t!r}: expected host:port")
        out.append(t)
    if not out:
        raise StackError("no scrape targets given")
    return out


class LocalStack:
    """Prometheus + Alertmanager on loopback with everything under run_dir. See the module doc."""

    def __init__(self, run_dir: os.PathLike, targets: Iterable[str] = (DEFAULT_TARGET,),
                 cfg: Optional[Mapping[str, Any]] = None, files: Optional[Mapping[str, str]] = None,
                 prometheus_port: int = 0, alertmanager_port: int = 0, scrape_interval: str = "5s",
                 evaluation_interval: Optional[str] = None, daemon: bool = False,
                 scrape_options: Optional[Mapping[str, Any]] = None, nice: int = 0):
        self.run_dir = Path(run_dir).resolve()
        self.scrape_options = dict(scrape_options or {})
        self.targets = list(targets)
        self.cfg = cfg
        self.files = dict(files) if files is not None else None
        self.prometheus_port = prometheus_port or free_port()
        self.alertmanager_port = alertmanager_port or free_port()
        if self.prometheus_port == self.alertmanager_port:
            raise StackError(f"Prometheus and Alertmanager cannot share port {self.prometheus_port}")
        self.scrape_interval = scrape_interval
        self.evaluation_interval = evaluation_interval or scrape_interval
        self.daemon = daemon
        self.owner = ""  # who started it, when not `ranksight stack up` (stack.json; status and down say it)
        d = self.run_dir
        self.prometheus = servers.prometheus(
            d / "prometheus.yml", d / "prometheus-data", d / "prometheus.log", port=self.prometheus_port,
            pid_file=d / "prometheus.pid", nice=nice,
            flags=[f"--web.external-url={self.prom_url}/", "--web.enable-lifecycle",
                   # Prometheus drops the alerts it evaluates before it has discovered Alertmanager (about
                   # 5 s after start) and resends only every resend-delay (default 1m): one evaluation.
                   f"--rules.alert.resend-delay={self._resend_delay()}"])
        self.alertmanager = servers.alertmanager(
            d / ALERTMANAGER_FILE, d / "alertmanager-data", d / "alertmanager.log", port=self.alertmanager_port,
            pid_file=d / "alertmanager.pid", nice=nice, flags=[f"--web.external-url={self.am_url}/"])

    # -------------------------------------------------------------- URLs and clients
    @property
    def prom_url(self) -> str:
        return f"http://127.0.0.1:{self.prometheus_port}"

    @property
    def am_url(self) -> str:
        return f"http://127.0.0.1:{self.alertmanager_port}"

    @property
    def prom(self) -> PrometheusAPI:
        return PrometheusAPI(self.prom_url)

    @property
    def am(self) -> AlertmanagerAPI:
        return AlertmanagerAPI(self.am_url)

    def pids(self) -> Dict[str, Optional[int]]:
        return {s.kind: s.pid() for s in (self.prometheus, self.alertmanager)}

    # -------------------------------------------------------------- lifecycle
    def write_files(self) -> None:
        """Render prometheus.yml, rules/*.yml and alertmanager.yml into the run dir."""
        files = dict(self.files) if self.files is not None else {}
        if self.files is None or ALERTMANAGER_FILE not in files:
            rendered = render_alert_files(self.cfg if self.cfg is not None else config.load())
            files = rendered if self.files is None else {
                **files, **{k: v for k, v in rendered.items() if k == ALERTMANAGER_FILE or self._is_template(k)}}
        rules_dir = self.run_dir / "rules"
        rules_dir.mkdir(parents=True, exist_ok=True)
        for old in rules_dir.glob("*.yml"):
            old.unlink()
        for name, text in files.items():
            if self._is_rule_file(name):
                (rules_dir / name).write_text(text)
        (self.run_dir / ALERTMANAGER_FILE).write_text(files[ALERTMANAGER_FILE])
        for name, text in files.items():
            if self._is_template(name):
                (self.run_dir / name).parent.mkdir(parents=True, exist_ok=True)
                (self.run_dir / name).write_text(text)
        template = (deploy_dir() / "prometheus.yml").read_text()
        (self.run_dir / "prometheus.yml").write_text(render_prometheus_config(
            template, self.targets, f"127.0.0.1:{self.alertmanager_port}", str(rules_dir / "*.yml"),
            self.scrape_interval, self.evaluation_interval, self.scrape_options))

    @staticmethod
    def _is_rule_file(name: str) -> bool:
        return "/" not in name and name.endswith((".yml", ".yaml")) and not name.startswith("alertmanager")

    @staticmethod
    def _is_template(name: str) -> bool:
        return name.startswith(TEMPLATES_DIR + "/") and name.endswith(".tmpl")

    def start(self, timeout: float = 30.0) -> "LocalStack":
        find_binary("prometheus"), find_binary("alertmanager")  # fail before writing anything
        for what, port, flag in (("Prometheus", self.prometheus_port, "--prometheus-port"),
                                 ("Alertmanager", self.alertmanager_port, "--alertmanager-port")):
            if port_in_use(port):
                raise StackError(f"port 127.0.0.1:{port} for {what} is in use (pick another with {flag})")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.write_files()
        d = self.run_dir
        self.alertmanager.start(self.daemon)
        self.prometheus.start(self.daemon)
        (d / "stack.json").write_text(json.dumps({
            "prometheus": {"port": self.prometheus_port, "url": self.prom_url},
            "alertmanager": {"port": self.alertmanager_port, "url": self.am_url},
            "targets": self.targets, "scrape_interval": self.scrape_interval, "owner": self.owner}, indent=1) + "\n")
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def set_targets(self, targets: Sequence[str], timeout: float = 20.0) -> None:
        """Scrape these agents instead: re-render prometheus.yml, POST /-/reload, and wait until
        Prometheus lists exactly these targets (StackError if it does not)."""
        self.targets = list(targets)
        self.write_files()
        req = urllib.request.Request(f"{self.prom_url}/-/reload", data=b"", method="POST")
        with urllib.request.urlopen(req, timeout=10):  # noqa: S310 - our loopback server
            pass
        want = set(self.targets)
        if not wait_until(lambda: {t["labels"].get("instance") for t in self.prom.targets()} == want, timeout):
            raise StackError(f"Prometheus did not switch to targets {sorted(want)} within {timeout:.0f} s")

    def _resend_delay(self) -> str:
        return self.evaluation_interval if config.duration_seconds(self.evaluation_interval) < 60 else "1m"

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Until both answer /-/ready; StackError naming the failing one (and its log line)."""
        deadline = time.monotonic() + timeout
        for server in (self.prometheus, self.alertmanager):
            server.wait_ready(timeout, deadline)

    def stop(self) -> None:
        self.prometheus.stop()
        self.alertmanager.stop()

    def __enter__(self) -> "LocalStack":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @classmethod
    def attach(cls, run_dir: os.PathLike) -> "LocalStack":
        """The stack a previous `stack up` left in run_dir (for status/down)."""
        d = Path(run_dir).resolve()
        try:
            state = json.loads((d / "stack.json").read_text())
        except (OSError, ValueError):
            state = {"prometheus": {"port": 1}, "alertmanager": {"port": 2}, "targets": []}
        stack = cls(d, state.get("targets", []), files={}, prometheus_port=state["prometheus"]["port"],
                    alertmanager_port=state["alertmanager"]["port"],
                    scrape_interval=state.get("scrape_interval", "15s"), daemon=True)
        stack.owner = str(state.get("owner") or "")
        return stack


# ------------------------------------------------------------------ the agent
class AgentProcess:
    """A real `ranksight exporter` on loopback, configured through RANKSIGHT__agent__* env."""

    def __init__(self, log_dir: os.PathLike, listen_port: int = 0, ingest_port: int = 0,
                 collectors: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
                 args: Sequence[str] = (), name: str = "agent", nice: int = 0):
        self.log_dir = Path(log_dir)
        self.listen_port = listen_port or free_port()
        self.ingest_port = ingest_port or free_port(udp=True)
        self.log_file = self.log_dir / f"{name}.log"
        e = dict(os.environ)
        e.update({"RANKSIGHT__agent__listen": f"127.0.0.1:{self.listen_port}",
                  "RANKSIGHT__agent__ingest": self.ingest, "PYTHONUNBUFFERED": "1"})
        if collectors is not None:
            e["RANKSIGHT__agent__collectors"] = collectors
        e.update(env or {})
        self.proc = Proc([sys.executable, "-m", "ranksight", "exporter", *args], self.log_file, e, name=name,
                         pid_file=self.log_dir / f"{name}.pid", marker="ranksight", nice=nice)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.listen_port}"

    @property
    def url(self) -> str:
        return f"http://{self.target}"

    @property
    def ingest(self) -> str:
        return f"udp://127.0.0.1:{self.ingest_port}"

    @property
    def pid(self) -> Optional[int]:
        return self.proc.pid()

    def metrics_text(self) -> str:
        return http_get(f"{self.url}/metrics").decode()

    def start(self, timeout: float = 20.0) -> "AgentProcess":
        if port_in_use(self.listen_port):
            raise StackError(f"port 127.0.0.1:{self.listen_port} for the agent is in use")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.proc.start(daemon=False)
        ok, code = wait_http(f"{self.url}/metrics", timeout, self.proc.popen)
        if code is not None:
            raise StackError(f"ranksight exporter exited with code {code}: {last_line(self.log_file)} "
                             f"(log: {self.log_file})")
        if not ok:
            self.stop()
            raise StackError(f"ranksight exporter not serving {self.url}/metrics after {timeout:.0f} s "
                             f"(log: {self.log_file})")
        return self

    def stop(self) -> None:
        self.proc.stop()

    def __enter__(self) -> "AgentProcess":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


# ------------------------------------------------------------------ CLI
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Run Debian's prometheus and prometheus-alertmanager on 127.0.0.1 with deploy/prometheus.yml "
                     "(rendered into the run dir with these targets and ports) and the ranksight rules and "
                     "Alertmanager config rendered for --profile.")
    p.epilog = "exit status: 0 ok (status: both running), 1 status: one running, 3 status: none running, 2 error"
    p.add_argument("action", choices=("up", "down", "status"),
                   help="up: start and wait until ready; down: stop; status: say what runs")
    p.add_argument("--run-dir", default=DEFAULT_RUN_DIR, metavar="DIR",
                   help=f"configs, rendered rules, data, logs and pid files (default ./{DEFAULT_RUN_DIR})")
    p.add_argument("--config", metavar="FILE", help="YAML config file for the rules (default: $RANKSIGHT_CONFIG)")
    p.add_argument("--profile", default="default", choices=sorted(config.PROFILES),
                   help="rules profile: default, or test (short `for:` and windows; scrapes every 5 s)")
    p.add_argument("--targets", default=DEFAULT_TARGET, metavar="HOST:PORT,...",
                   help=f"ranksight agents to scrape (default {DEFAULT_TARGET})")
    p.add_argument("--prometheus-port", type=int, default=DEFAULT_PROMETHEUS_PORT, metavar="N",
                   help=f"Prometheus port on 127.0.0.1 (default {DEFAULT_PROMETHEUS_PORT})")
    p.add_argument("--alertmanager-port", type=int, default=DEFAULT_ALERTMANAGER_PORT, metavar="N",
                   help=f"Alertmanager port on 127.0.0.1 (default {DEFAULT_ALERTMANAGER_PORT})")
    p.add_argument("--scrape-interval", metavar="DUR",
                   help="scrape and rule evaluation interval (default 15s; 5s with --profile test)")
    p.add_argument("--timeout", type=float, default=30.0, metavar="S", help="up: seconds to wait for ready")
    p.add_argument("--engine", default="prometheus", choices=("prometheus", vmstack.ENGINE),
                   help="up: prometheus (one Prometheus, the default), or victoriametrics: --shards vmagent scrape "
                        "shards writing to one VictoriaMetrics store, vmalert evaluating the rules against it and "
                        "sending to the same Alertmanager (docs/SCALING.md)")
    p.add_argument("--shards", type=int, default=2, metavar="N", help="victoriametrics: vmagent scrape shards (default 2)")
    p.add_argument("--store-port", type=int, default=vmstack.DEFAULT_STORE_PORT, metavar="N",
                   help=f"victoriametrics: the store's port on 127.0.0.1 (default {vmstack.DEFAULT_STORE_PORT})")
    p.add_argument("--vmalert-port", type=int, default=vmstack.DEFAULT_VMALERT_PORT, metavar="N",
                   help=f"victoriametrics: vmalert's port on 127.0.0.1 (default {vmstack.DEFAULT_VMALERT_PORT})")


def _status_lines(stack: LocalStack) -> List[str]:
    pids = stack.pids()
    lines = [f"started by    {stack.owner}"] if stack.owner and any(pids.values()) else []
    for name, url, api in (("prometheus", stack.prom_url, stack.prom), ("alertmanager", stack.am_url, stack.am)):
        pid = pids[name]
        if pid is None:
            lines.append(f"{name:<13} stopped")
        else:
            lines.append(f"{name:<13} running  pid {pid:<7} {url}  {'ready' if api.ready() else 'not ready'}")
    if pids["prometheus"] is not None:
        try:
            for t in stack.prom.targets():
                err = f"  ({t['lastError']})" if t.get("lastError") else ""
                lines.append(f"target        {t['labels'].get('instance', t['scrapeUrl']):<21} {t['health']}{err}")
            groups = stack.prom.rules()
            n = sum(len(g["rules"]) for g in groups)
            lines.append(f"rules         {n} in {len(groups)} groups")
        except (ApiError, OSError, urllib.error.URLError, ValueError) as e:
            lines.append(f"prometheus API: {e}")
    return lines


def stack_command(action: str, run_dir: os.PathLike) -> str:
    """The shortest `ranksight stack ACTION` that reaches run_dir from the current directory:
    no --run-dir for the default one, else the shorter of its relative and absolute paths."""
    d = Path(run_dir).resolve()
    if d == Path(DEFAULT_RUN_DIR).resolve():
        return f"ranksight stack {action}"
    rel = os.path.relpath(d)
    return f"ranksight stack {action} --run-dir {shlex.quote(min(rel, str(d), key=len))}"


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except StackError as e:
        return error(str(e))


def _engine_state(run_dir: Path) -> Optional[Dict[str, Any]]:
    """stack.json of a VictoriaMetrics layout in run_dir, else None."""
    try:
        state = json.loads((run_dir / "stack.json").read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) and state.get("engine") == vmstack.ENGINE else None


def _run_vm(args: argparse.Namespace, run_dir: Path, state: Optional[Dict[str, Any]]) -> int:
    """`stack up --engine victoriametrics`, and status/down of such a stack."""
    if state is not None:
        stack = vmstack.VMStack.attach(run_dir, state)
        pids = stack.pids()
        if args.action == "down":
            if any(pids.values()):
                stack.stop()
            print(f"ranksight stack: stopped ({', '.join(k for k, v in pids.items() if v) or 'nothing ran'})")
            return 0
        if args.action == "status":
            for line in vmstack.status_lines(stack):
                print(line)
            running = sum(1 for v in pids.values() if v)
            return 0 if running == len(pids) else (3 if running == 0 else 1)
        if any(pids.values()):
            print(f"ranksight stack: already running in {run_dir} ({stack_command('down', run_dir)} first)")
            return 0
    for port, flag in ((args.store_port, "--store-port"), (args.vmalert_port, "--vmalert-port"),
                       (args.alertmanager_port, "--alertmanager-port")):
        if not 0 < port < 65536:
            raise StackError(f"{flag} {port}: expected a port in 1..65535")
    if not 1 <= args.shards <= 64:
        raise StackError(f"--shards {args.shards}: expected 1..64")
    targets = parse_targets(args.targets)
    interval = args.scrape_interval or ("5s" if args.profile == "test" else "15s")
    if not re.fullmatch(r"(\d+(ms|s|m|h))+", interval):
        raise StackError(f"--scrape-interval {interval!r}: expected a duration like 5s or 1m")
    cfg = config.load(args.config, args.profile)
    stack = vmstack.VMStack(run_dir, targets, shards=args.shards, cfg=cfg, store_port=args.store_port,
                            vmalert_port=args.vmalert_port, alertmanager_port=args.alertmanager_port,
                            scrape_interval=interval, daemon=True)
    stack.start(timeout=args.timeout)
    print(f"victoria-metrics {stack.store_url}   (the store: query API and remote write; Grafana's datasource: "
          f"{stack.run_dir / vmstack.DATASOURCE_FILE})")
    print(f"vmalert          {stack.vmalert_url}   (rules: profile {args.profile}, engine {vmstack.ENGINE})")
    print(f"alertmanager     {stack.am_url}")
    print(f"vmagent          {args.shards} shards scraping {', '.join(targets)} every {interval}; "
          f"data and logs in {stack.run_dir}")
    print(f"stop with        {stack_command('down', stack.run_dir)}")
    return 0


def _run(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    vm_state = _engine_state(run_dir)
    if vm_state is not None or (args.action == "up" and args.engine == vmstack.ENGINE):
        return _run_vm(args, run_dir, vm_state)
    if args.action in ("down", "status"):
        stack = LocalStack.attach(run_dir)
        pids = stack.pids()
        if args.action == "down":
            if not any(pids.values()):
                print(f"ranksight stack: not running ({run_dir})")
                return 0
            stack.stop()
            left = {k: v for k, v in stack.pids().items() if v}
            if left:
                raise StackError(f"still running after stop: {left}")
            print(f"ranksight stack: stopped ({', '.join(k for k, v in pids.items() if v)})" +
                  (f"; {stack.owner} sees that and exits" if stack.owner else ""))
            return 0
        for line in _status_lines(stack):
            print(line)
        running = sum(1 for v in pids.values() if v)
        return 0 if running == 2 else (3 if running == 0 else 1)

    for port, flag in ((args.prometheus_port, "--prometheus-port"), (args.alertmanager_port, "--alertmanager-port")):
        if not 0 < port < 65536:
            raise StackError(f"{flag} {port}: expected a port in 1..65535")
    targets = parse_targets(args.targets)
    interval = args.scrape_interval or ("5s" if args.profile == "test" else "15s")
    if not re.fullmatch(r"(\d+(ms|s|m|h))+", interval):
        raise StackError(f"--scrape-interval {interval!r}: expected a duration like 5s or 1m")
    previous = LocalStack.attach(run_dir)
    if any(previous.pids().values()):
        print(f"ranksight stack: already running in {run_dir} ({stack_command('down', run_dir)} first)")
        for line in _status_lines(previous):
            print(line)
        return 0
    find_binary("prometheus"), find_binary("alertmanager")  # fail before rendering anything
    cfg = config.load(args.config, args.profile)
    stack = LocalStack(run_dir, targets, cfg=cfg, prometheus_port=args.prometheus_port,
                       alertmanager_port=args.alertmanager_port, scrape_interval=interval, daemon=True)
    stack.start(timeout=args.timeout)
    print(f"prometheus    {stack.prom_url}   (pid {stack.pids()['prometheus']}, rules: profile {args.profile})")
    print(f"alertmanager  {stack.am_url}   (pid {stack.pids()['alertmanager']})")
    print(f"scraping      {', '.join(targets)} every {interval}; data and logs in {stack.run_dir}")
    print(f"stop with     {stack_command('down', stack.run_dir)}")
    return 0
