"""The VictoriaMetrics layout: N vmagent scrape shards -> one VictoriaMetrics store <- vmalert ->
the same Alertmanager (``ranksight stack up --engine victoriametrics``, torch-free).

Every config comes from the same sources as the Prometheus stack's: the shards' scrape config is
deploy/prometheus.yml rendered with the targets (``stack.render_prometheus_config``) less the keys
only Prometheus reads; vmalert's rules are ``ranksight rules --engine victoriametrics``
(``ranksight.alerts.engines``: the generated file with same-group reads rewritten); alertmanager.yml
and its templates are ``render_alert_files``; Grafana's datasource is
deploy/grafana/provisioning/datasources/prometheus.yml pointed at the store (the dashboards
unchanged: the store answers the Prometheus query API).

Sharding: each vmagent runs ``-promscrape.cluster.membersCount=N -promscrape.cluster.memberNum=i``
and scrapes the targets whose label set hashes to it. A node has one ranksight target (its agent
serves the node's rank, GPU and node series), so a node's series stay on one shard.

``render_layout(cfg, targets, shards, ...) -> {file name: text}`` and the command lines
(``store_argv``, ``vmagent_argv``, ``vmalert_argv``) are what the Kubernetes overlay and the tests
use too. ``VMStack(run_dir, targets, shards=2, cfg=None, ...)``: ``start(timeout)``, ``stop()``,
``pids()``, ``store`` (a ``PrometheusAPI`` on the store: the records and raw series), ``vmalert``
(its rules and alerts, as Prometheus' API answers them), ``am``, ``dedup`` (the store's
``-dedup.minScrapeInterval``: the scrape interval for two scrapers per shard),
``store_url``, ``vmalert_url``, ``am_url``, ``attach(run_dir)``; stack.json holds
``"engine": "victoriametrics"``, so ``stack status`` and ``stack down`` find it.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

import yaml

from .. import config
from ..common import servers
from ..common.plumbing import AlertmanagerAPI, PrometheusAPI, Proc, free_port, http_get, port_in_use, wait_until
from ..common.servers import ServerError, find_binary, wait_serving
from .stack_files import ALERTMANAGER_FILE, deploy_dir, render_alert_files, render_prometheus_config

ENGINE = "victoriametrics"
DEFAULT_STORE_PORT = 8428
DEFAULT_VMALERT_PORT = 8880
SCRAPE_FILE = "vmagent-scrape.yml"
RULES_DIR = "rules"
DATASOURCE_FILE = "grafana/datasources.yml"
# keys of deploy/prometheus.yml only Prometheus reads (vmagent refuses unknown keys; vmalert gets
# the rules and the Alertmanager on its command line)
_PROMETHEUS_ONLY = ("rule_files", "alerting")
# The store answers queries up to this long before now (its default, 30 s, would hide the newest
# scrapes from vmalert's 5 s and 15 s evaluations).
LATENCY_OFFSET = "1s"


def scrape_config(template: str, targets: Sequence[str], scrape_interval: Optional[str] = None,
                  scrape_options: Optional[Mapping[str, Any]] = None) -> str:
    """deploy/prometheus.yml for vmagent: the targets set, the keys only Prometheus reads dropped."""
    doc = yaml.safe_load(render_prometheus_config(template, targets, "unused:1", "unused", scrape_interval,
                                                  None, scrape_options))
    for key in _PROMETHEUS_ONLY:
        doc.pop(key, None)
    doc.get("global", {}).pop("evaluation_interval", None)
    head = ("# Rendered by `ranksight stack --engine victoriametrics` from deploy/prometheus.yml for the vmagent "
            "shards. Do not edit: edit that file.\n")
    return head + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)


def grafana_datasource(template: str, store_url: str) -> str:
    """deploy/grafana's datasource file with the Prometheus datasource pointed at the store (same
    uid, so the dashboards need no change)."""
    doc = yaml.safe_load(template)
    for ds in doc.get("datasources", []):
        if ds.get("type") == "prometheus":
            ds["url"] = store_url
    head = ("# Rendered for the VictoriaMetrics layout from deploy/grafana/provisioning/datasources/prometheus.yml: "
            "the Prometheus datasource reads the VictoriaMetrics store.\n")
    return head + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)


def render_layout(cfg: Mapping[str, Any], targets: Sequence[str], store_url: str,
                  scrape_interval: Optional[str] = None,
                  scrape_options: Optional[Mapping[str, Any]] = None) -> Dict[str, str]:
    """File name -> text: the shards' scrape config, vmalert's rules, alertmanager.yml with its
    templates, Grafana's datasource."""
    from ranksight.alerts import engines, generate

    d = deploy_dir()
    alert_files = render_alert_files(cfg)
    files = {SCRAPE_FILE: scrape_config((d / "prometheus.yml").read_text(), targets, scrape_interval, scrape_options),
             f"{RULES_DIR}/{generate.RULES_FILE}": engines.victoriametrics(alert_files[generate.RULES_FILE]),
             ALERTMANAGER_FILE: alert_files[ALERTMANAGER_FILE],
             DATASOURCE_FILE: grafana_datasource(
                 (d / "grafana/provisioning/datasources/prometheus.yml").read_text(), store_url)}
    files.update({k: v for k, v in alert_files.items() if k.startswith("templates/")})
    return files


# ------------------------------------------------------------------ command lines
def store_argv(binary: str, data: str, listen: str, retention: str = "1y", dedup: Optional[str] = None,
               vmalert_url: Optional[str] = None) -> List[str]:
    """The single-node store: remote-write receiver and Prometheus query API on ``listen``.
    ``dedup``: ``-dedup.minScrapeInterval`` for two scrapers per shard (the scrape interval);
    ``vmalert_url``: the store answers /api/v1/alerts and /api/v1/rules from vmalert (Grafana's
    alert list, and every client that reads alerts where it queries)."""
    argv = [binary, f"-storageDataPath={data}", f"-httpListenAddr={listen}", f"-retentionPeriod={retention}",
            f"-search.latencyOffset={LATENCY_OFFSET}", "-loggerLevel=WARN"]
    argv += [f"-vmalert.proxyURL={vmalert_url}"] if vmalert_url else []
    return argv + ([f"-dedup.minScrapeInterval={dedup}"] if dedup else [])


def vmagent_argv(binary: str, shard: int, shards: int, scrape_file: str, store_url: str, listen: str,
                 tmp_dir: str) -> List[str]:
    """One scrape shard: the targets hashing to ``shard`` of ``shards``, remote-written to the store."""
    argv = [binary, f"-promscrape.config={scrape_file}", f"-remoteWrite.url={store_url}/api/v1/write",
            f"-httpListenAddr={listen}", f"-remoteWrite.tmpDataPath={tmp_dir}", "-remoteWrite.flushInterval=1s",
            "-promscrape.suppressScrapeErrors", "-loggerLevel=WARN"]
    if shards > 1:
        argv += [f"-promscrape.cluster.membersCount={shards}", f"-promscrape.cluster.memberNum={shard}"]
    return argv


def vmalert_argv(binary: str, rule_glob: str, store_url: str, am_url: str, listen: str, evaluation_interval: str,
                 external_url: str) -> List[str]:
    """vmalert: the rules evaluated against the store, records and alert state written back to it
    (``-remoteRead`` restores the alerts' ``for`` state after a restart), alerts sent to Alertmanager."""
    return [binary, f"-rule={rule_glob}", f"-datasource.url={store_url}", f"-remoteWrite.url={store_url}",
            f"-remoteRead.url={store_url}", f"-notifier.url={am_url}", f"-evaluationInterval={evaluation_interval}",
            f"-httpListenAddr={listen}", f"-external.url={external_url}", "-remoteWrite.flushInterval=1s",
            "-loggerLevel=WARN"]


class VMServer:
    """One VictoriaMetrics binary on loopback, ready when /health answers."""

    def __init__(self, name: str, argv: List[str], port: int, run_dir: Path, nice: int = 0):
        self.name, self.port = name, port
        self.proc = Proc(argv, run_dir / f"{name}.log", name=name, pid_file=run_dir / f"{name}.pid",
                         marker=str(run_dir), nice=nice)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def pid(self) -> Optional[int]:
        return self.proc.pid()

    def start(self, daemon: bool) -> None:
        self.proc.start(daemon)

    def wait_ready(self, deadline: float, timeout: float) -> None:
        wait_serving(self.proc, f"{self.url}/health", self.name, deadline - time.monotonic(), timeout)

    def stop(self) -> None:
        self.proc.stop()


class VMStack:
    """vmagent shards, the store, vmalert and Alertmanager on loopback under run_dir (module doc)."""

    def __init__(self, run_dir: os.PathLike, targets: Iterable[str], shards: int = 2,
                 cfg: Optional[Mapping[str, Any]] = None, store_port: int = 0, vmalert_port: int = 0,
                 alertmanager_port: int = 0, agent_ports: Sequence[int] = (), scrape_interval: str = "5s",
                 evaluation_interval: Optional[str] = None, daemon: bool = False,
                 scrape_options: Optional[Mapping[str, Any]] = None, nice: int = 0, dedup: Optional[str] = None):
        if shards < 1:
            raise ServerError(f"--shards {shards}: expected 1 or more")
        self.run_dir = Path(run_dir).resolve()
        self.targets, self.shards, self.cfg = list(targets), shards, cfg
        self.scrape_interval = scrape_interval
        self.evaluation_interval = evaluation_interval or scrape_interval
        self.daemon, self.scrape_options, self.owner = daemon, dict(scrape_options or {}), ""
        self.store_port = store_port or free_port()
        self.vmalert_port = vmalert_port or free_port()
        self.alertmanager_port = alertmanager_port or free_port()
        self.agent_ports = list(agent_ports) or [free_port() for _ in range(shards)]
        d = self.run_dir
        self.alertmanager = servers.alertmanager(
            d / "alertmanager.yml", d / "alertmanager-data", d / "alertmanager.log", port=self.alertmanager_port,
            pid_file=d / "alertmanager.pid", nice=nice, flags=[f"--web.external-url={self.am_url}/"])
        self._nice, self.dedup = nice, dedup
        self._servers: Optional[List[VMServer]] = None
        self._attached = False  # status and down: the pid files are enough, the binaries may be gone

    def _binary(self, name: str) -> str:
        try:
            return find_binary(name)
        except ServerError:
            if self._attached:
                return name
            raise

    # -------------------------------------------------------------- URLs and clients
    @property
    def store_url(self) -> str:
        return f"http://127.0.0.1:{self.store_port}"

    @property
    def vmalert_url(self) -> str:
        return f"http://127.0.0.1:{self.vmalert_port}"

    @property
    def am_url(self) -> str:
        return f"http://127.0.0.1:{self.alertmanager_port}"

    @property
    def store(self) -> PrometheusAPI:
        return PrometheusAPI(self.store_url)

    @property
    def prom_url(self) -> str:
        """Where Prometheus' clients point (``ranksight triage --prometheus``, Grafana): the store."""
        return self.store_url

    @property
    def prom(self) -> PrometheusAPI:
        """The store as LocalStack.prom answers: queries, and alerts and rules through vmalert."""
        return self.store

    @property
    def vmalert(self) -> PrometheusAPI:
        """vmalert's own API: /api/v1/rules and /api/v1/alerts as Prometheus answers them."""
        return PrometheusAPI(self.vmalert_url)

    @property
    def am(self) -> AlertmanagerAPI:
        return AlertmanagerAPI(self.am_url)

    def servers(self) -> List[VMServer]:
        """The store, vmalert and the shards (their command lines need the binaries: built on demand)."""
        if self._servers is None:
            d, store = self.run_dir, self.store_url
            self._servers = [
                VMServer("victoria-metrics", store_argv(self._binary("victoria-metrics"), str(d / "store-data"),
                                                        f"127.0.0.1:{self.store_port}", dedup=self.dedup,
                                                        vmalert_url=self.vmalert_url),
                         self.store_port, d, self._nice),
                VMServer("vmalert", vmalert_argv(self._binary("vmalert"), str(d / RULES_DIR / "*.yml"), store, self.am_url,
                                                 f"127.0.0.1:{self.vmalert_port}", self.evaluation_interval,
                                                 self.vmalert_url), self.vmalert_port, d, self._nice),
                *[VMServer(f"vmagent-{i}", vmagent_argv(self._binary("vmagent"), i, self.shards, str(d / SCRAPE_FILE),
                                                         store, f"127.0.0.1:{port}", str(d / f"vmagent-{i}-data")),
                           port, d, self._nice) for i, port in enumerate(self.agent_ports)]]
        return self._servers

    def pids(self) -> Dict[str, Optional[int]]:
        out = {"alertmanager": self.alertmanager.pid()}
        for s in self.servers():
            out[s.name] = s.pid()
        return out

    # -------------------------------------------------------------- lifecycle
    def write_files(self) -> None:
        files = render_layout(self.cfg if self.cfg is not None else config.load(), self.targets, self.store_url,
                              self.scrape_interval, self.scrape_options)
        rules = self.run_dir / RULES_DIR
        rules.mkdir(parents=True, exist_ok=True)
        for old in rules.glob("*.yml"):
            old.unlink()
        for name, text in files.items():
            (self.run_dir / name).parent.mkdir(parents=True, exist_ok=True)
            (self.run_dir / name).write_text(text)

    def start(self, timeout: float = 30.0) -> "VMStack":
        self.servers()  # every binary found before anything is written
        find_binary("alertmanager")
        for name, port in [("Alertmanager", self.alertmanager_port), ("the store", self.store_port),
                           ("vmalert", self.vmalert_port)] + [(f"vmagent {i}", p) for i, p in enumerate(self.agent_ports)]:
            if port_in_use(port):
                raise ServerError(f"port 127.0.0.1:{port} for {name} is in use")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.write_files()
        self.alertmanager.start(self.daemon)
        for s in self.servers():
            s.start(self.daemon)
        (self.run_dir / "stack.json").write_text(json.dumps({
            "engine": ENGINE, "store": {"port": self.store_port}, "vmalert": {"port": self.vmalert_port},
            "alertmanager": {"port": self.alertmanager_port}, "agents": self.agent_ports, "shards": self.shards,
            "targets": self.targets, "scrape_interval": self.scrape_interval, "owner": self.owner}, indent=1) + "\n")
        try:
            deadline = time.monotonic() + timeout
            self.alertmanager.wait_ready(timeout, deadline)
            for s in self.servers():
                s.wait_ready(deadline, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def set_targets(self, targets: Sequence[str], timeout: float = 20.0) -> None:
        """Scrape these agents instead: re-render the shards' scrape config, /-/reload every shard,
        and wait until the shards together list exactly these targets (ServerError if not)."""
        self.targets = list(targets)
        (self.run_dir / SCRAPE_FILE).write_text(scrape_config((deploy_dir() / "prometheus.yml").read_text(),
                                                              self.targets, self.scrape_interval, self.scrape_options))
        shards = [s for s in self.servers() if s.name.startswith("vmagent")]
        for s in shards:
            http_get(f"{s.url}/-/reload", 10)
        want = sorted(self.targets)

        def listed() -> bool:
            got = [t["labels"].get("instance") for s in shards for t in PrometheusAPI(s.url).targets()]
            return sorted(got) == want

        if not wait_until(listed, timeout):
            raise ServerError(f"vmagent did not switch to targets {want} within {timeout:.0f} s")

    def stop(self) -> None:
        for s in reversed(self.servers()):
            s.stop()
        self.alertmanager.stop()

    def __enter__(self) -> "VMStack":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @classmethod
    def attach(cls, run_dir: os.PathLike, state: Mapping[str, Any]) -> "VMStack":
        """The stack a previous ``stack up --engine victoriametrics`` left in run_dir (status, down)."""
        stack = cls(run_dir, state.get("targets", []), shards=max(1, int(state.get("shards", 1))),
                    store_port=state["store"]["port"], vmalert_port=state["vmalert"]["port"],
                    alertmanager_port=state["alertmanager"]["port"], agent_ports=state.get("agents", []),
                    scrape_interval=state.get("scrape_interval", "15s"), daemon=True)
        stack.owner = str(state.get("owner") or "")
        stack._attached = True
        return stack


def status_lines(stack: VMStack) -> List[str]:
    pids = stack.pids()
    lines = [f"started by    {stack.owner}"] if stack.owner and any(pids.values()) else []
    urls = {"alertmanager": stack.am_url, **{s.name: s.url for s in stack.servers()}}
    for name, pid in pids.items():
        lines.append(f"{name:<17} " + ("stopped" if pid is None else f"running  pid {pid:<7} {urls[name]}"))
    return lines
