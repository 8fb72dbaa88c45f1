"""`ranksight act`: an Alertmanager webhook receiver that acts on each verdict by one policy, the
``action`` of the verdict's triage entry (ranksight/triage/, ``Entry.action``):

  restart_workers  (RanksightRankStalled)  end the job's workers on the culprit's node, through that node's
                                           agent (act.agent_url, e.g. https://{node}:9945, filled from the
                                           alert's labels); the elastic launcher restarts them from the last
                                           checkpoint
  drain_node       (GPU XID, NIC, disk)    drain the node in the job's engine (Slurm, Kubernetes)
  record_recovery  (RanksightRankDown)     nothing to end: record the launcher's recovery when the rank is back
  page             (everything else)       nothing: Alertmanager's own receivers page

Each verdict's mode (``act.mode``, per alert ``act.modes``): ``off``, ``propose`` (the default: the log and
``/api/v1/actions`` carry the exact command; ``ranksight act approve ID`` runs it) or ``auto``.
``act.dry_run`` (on by default) logs an approved or automatic action instead of running it.

Safety: every request carries the bearer token of ``act.token_file`` (Alertmanager's
``http_config.authorization.credentials_file``) or a verified client certificate (``act.web_config_file``,
the agent's web config format, exporter/webconfig.py); anything else is refused and counted. The ledger
is keyed by the alert's fingerprint and start, so Alertmanager's repeats do nothing; a verdict whose
resolve has arrived is never acted on; one restart per job and node and one drain per node while they
stand; at most ``act.max_drains_per_hour`` drains; never a drain that leaves a job fewer than
``act.job_min_nodes`` undrained nodes. Every outcome is logged and counted in
``ranksight_actions_total{verdict,action,result}`` on ``/metrics``.
"""
from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .. import catalog as C
from .. import config as cfgmod
from .. import triage
from ..console import error
from ..errors import ConfigError
from .act_engines import ActError, Engine, Workers, engine as make_engine

log = logging.getLogger("ranksight.act")
ALERTS_PATH, ACTIONS_PATH, APPROVE_PATH = "/alerts", "/api/v1/actions", "/api/v1/approve/"
WINDOW = 3600.0  # act.max_drains_per_hour counts the drains of the last hour
RECOVERY_TIMEOUT = 600.0  # a restart's recovery is watched this long


class NotHere(ActError):
    """A one-node setup (one fixed act.agent_url): the culprit's ranks are not at that agent."""


@dataclass
class Record:
    """One verdict (one alert instance: fingerprint and start) in the ledger."""
    id: str
    key: str
    verdict: str
    action: str
    mode: str
    labels: Dict[str, str]
    received: float
    state: str  # one of catalog.ACT_RESULTS
    command: str = ""
    detail: str = ""
    resolved: Optional[float] = None
    acted: Optional[float] = None
    recovered: Optional[float] = None
    recover_s: Optional[float] = None
    pids: List[int] = field(default_factory=list)
    node: str = ""  # the culprit's node
    agent_url: str = ""  # restart_workers: the agent of that node that listed and ends the workers


class Ledger:
    """Every verdict by key, appended to ``path`` (JSON lines, the last line of an id wins) when given."""

    def __init__(self, path: str = "") -> None:
        self.path = Path(path) if path else None
        self.records: Dict[str, Record] = {}
        if self.path is not None and self.path.exists():
            for line in self.path.read_text().splitlines():
                try:
                    r = Record(**json.loads(line))
                except (ValueError, TypeError):
                    continue
                self.records[r.key] = r

    def save(self, r: Record) -> None:
        self.records[r.key] = r
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(json.dumps(asdict(r)) + "\n")

    def by_id(self, rid: str) -> Optional[Record]:
        return next((r for r in self.records.values() if r.id == rid), None)


class Counters:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.actions: Dict[Tuple[str, str, str], int] = {}
        self.rejected: Dict[str, int] = dict.fromkeys(C.ACT_REJECT_REASONS, 0)

    def count(self, verdict: str, action: str, result: str) -> None:
        with self.lock:
            k = (verdict, action, result)
            self.actions[k] = self.actions.get(k, 0) + 1

    def reject(self, reason: str) -> None:
        with self.lock:
            self.rejected[reason] += 1

    def render(self) -> bytes:
        def esc(v: str) -> str:
            return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
        out = [f"# HELP {C.ACTIONS_TOTAL} {C.ACTIONS_TOTAL.help}", f"# TYPE {C.ACTIONS_TOTAL} counter"]
        with self.lock:
            for (v, a, r), n in sorted(self.actions.items()):
                out.append(f'{C.ACTIONS_TOTAL}{{verdict="{esc(v)}",action="{esc(a)}",result="{esc(r)}"}} {n}')
            out += [f"# HELP {C.ACT_REJECTED} {C.ACT_REJECTED.help}", f"# TYPE {C.ACT_REJECTED} counter"]
            out += [f'{C.ACT_REJECTED}{{reason="{k}"}} {n}' for k, n in self.rejected.items()]
        return ("\n".join(out) + "\n").encode()


class Actor:
    """The policy and its safety rules; the HTTP handler calls ``webhook`` and ``approve``."""

    def __init__(self, cfg: Mapping[str, Any], engine: Engine, workers: Workers, ledger: Ledger) -> None:
        self.cfg = cfg["act"]
        self.entries = triage.by_alert(cfg)
        unknown = sorted(set(self.cfg["modes"]) - set(self.entries))
        if unknown:
            raise ConfigError(f"config act.modes: {', '.join(unknown)} is no alert of the triage table")
        self.engine, self.workers, self.ledger = engine, workers, ledger
        self.counters = Counters()
        self.lock = threading.RLock()
        self.drains: List[float] = [r.acted for r in ledger.records.values()
                                    if r.action == triage.ACT_DRAIN and r.acted and r.state in ("done", "dry_run")]

    def mode(self, verdict: str) -> str:
        return self.cfg["modes"].get(verdict, self.cfg["mode"])

    def _finish(self, r: Record, state: str, detail: str = "") -> Record:
        r.state = state
        if detail:
            r.detail = detail
        self.ledger.save(r)
        self.counters.count(r.verdict, r.action, state)
        how = {"proposed": f"; approve with: ranksight act approve {r.id}"}.get(state, "")
        log.info("act %s %s %s %s: %s%s%s", r.id, r.verdict,
                 _where(r.labels) + (f" agent {r.agent_url}" if r.agent_url else ""), r.action, state,
                 f": {r.command}" if r.command and state in ("proposed", "dry_run", "done") else "",
                 (f" ({r.detail})" if r.detail else "") + how)
        return r

    # ------------------------------------------------------------ the webhook
    def webhook(self, doc: Any) -> List[Dict[str, str]]:
        """Alertmanager's webhook JSON (version 4). Raises ValueError when it is not that shape."""
        if not isinstance(doc, dict) or not isinstance(doc.get("alerts"), list):
            raise ValueError("expected Alertmanager's webhook JSON with an alerts list")
        for a in doc["alerts"]:  # all checked before any is acted on
            if not (isinstance(a, dict) and isinstance(a.get("labels"), dict) and a.get("status") in ("firing", "resolved")
                    and isinstance(a["labels"].get("alertname"), str)):
                raise ValueError("an alert without status or labels.alertname")
        out = []
        for a in doc["alerts"]:
            r = self.alert(a)
            out.append({"id": r.id, "verdict": r.verdict, "action": r.action, "state": r.state})
        return out

    def alert(self, a: Mapping[str, Any]) -> Record:
        labels = {str(k): str(v) for k, v in a["labels"].items()}
        verdict = labels["alertname"]
        fp = str(a.get("fingerprint") or hashlib.sha256(json.dumps(labels, sort_keys=True).encode()).hexdigest()[:16])
        key = f"{fp}@{a.get('startsAt', '')}"
        entry = self.entries.get(verdict)
        action = entry.action if entry is not None else triage.ACT_PAGE
        with self.lock:
            r = self.ledger.records.get(key)
            if a["status"] == "resolved":
                return self._resolved(r, key, verdict, action, labels)
            if r is not None:
                self.counters.count(verdict, action, "duplicate")
                return r
            r = Record(id=hashlib.sha256(key.encode()).hexdigest()[:10], key=key, verdict=verdict, action=action,
                       mode=self.mode(verdict), labels=labels, received=time.time(), state="",
                       node=labels.get("node", ""))
            if action == triage.ACT_PAGE or r.mode == "off":
                return self._finish(r, "paged")
            if action == triage.ACT_RECOVERY:
                return self._finish(r, "watching", "the launcher restarts the rank; recorded when it is back")
            same = self._standing(r)
            if same is not None:
                return self._finish(r, "duplicate", f"{same.action} {same.id} stands for {_where(r.labels)}")
            try:
                r.command = self._plan(r)
            except NotHere as e:
                return self._finish(r, "not_here", str(e))
            except ActError as e:
                return self._finish(r, "failed", str(e))
            if r.mode == "propose":
                return self._finish(r, "proposed")
            return self._execute(r)

    def _standing(self, r: Record) -> Optional[Record]:
        """An unresolved restart of the same job and node, or drain of the same node, in the ledger."""
        for o in self.ledger.records.values():
            if o.action != r.action or o.resolved is not None or o.state not in ("proposed", "dry_run", "done"):
                continue
            if o.labels.get("node") != r.labels.get("node"):
                continue
            if r.action == triage.ACT_DRAIN or o.labels.get("job") == r.labels.get("job"):
                return o
        return None

    def _resolved(self, r: Optional[Record], key: str, verdict: str, action: str, labels: Dict[str, str]) -> Record:
        now = time.time()
        if r is None:  # a resolve before (or without) its firing: nothing may act on it later
            r = Record(id=hashlib.sha256(key.encode()).hexdigest()[:10], key=key, verdict=verdict, action=action,
                       mode=self.mode(verdict), labels=labels, received=now, state="", resolved=now)
            return self._finish(r, "resolved", "resolve arrived before any firing")
        if r.resolved is not None:
            self.counters.count(verdict, action, "duplicate")
            return r
        r.resolved = now
        if r.state == "watching":  # RankDown resolved: recovered if this node's agent lists the rank up again
            back = self._rank_back(r)
            if back is None:
                return self._finish(r, "resolved", "resolved, but this node's agent does not list the rank up "
                                                   "(the job ended, or the rank runs elsewhere)")
            r.recovered, r.recover_s = now, round(now - r.received, 3)
            return self._finish(r, "recovered", f"rank back after {r.recover_s:g} s ({back})")
        if r.state == "proposed":
            return self._finish(r, "resolved", "resolved before approval: not run")
        self.ledger.save(r)
        return r

    def _rank_back(self, r: Record) -> Optional[str]:
        try:
            r.agent_url = r.agent_url or self.workers.url(r.labels)
            ranks = self.workers.ranks(r.agent_url, r.labels.get("job", ""), r.labels.get("node", ""))
        except ActError:
            return None
        for x in ranks:
            if str(x.get("rank")) == r.labels.get("rank") and x.get("up") and not x.get("finished"):
                return f"pid {x['pid']}, step {x['step']}"
        return None

    def _plan(self, r: Record) -> str:
        node = r.labels.get("node", "")
        if not node:
            raise ActError("the alert carries no node label")
        if r.action == triage.ACT_RESTART:
            job = r.labels.get("job", "")
            r.agent_url = self.workers.url(r.labels)
            ranks = self.workers.ranks(r.agent_url, job, node)
            r.pids = sorted(x["pid"] for x in ranks if type(x.get("pid")) is int and x["pid"] > 0 and not x.get("finished"))
            if not r.pids:
                raise (NotHere if self.workers.fixed else ActError)(
                    f"no rank of job {job} on node {node} at the agent {r.agent_url}")
            return self.workers.command(r.agent_url, job, node, r.pids)
        return self.engine.drain_command(node, f"ranksight: {r.verdict}")

    def approve(self, rid: str) -> Record:
        with self.lock:
            r = self.ledger.by_id(rid)
            if r is None:
                raise KeyError(rid)
            if r.state != "proposed":
                return r
            return self._execute(r)

    def _execute(self, r: Record) -> Record:
        if r.resolved is not None:
            return self._finish(r, "resolved", "resolved before it could run: not run")
        if r.action == triage.ACT_DRAIN:
            refused = self._drain_refused(r)
            if refused:
                return self._finish(r, *refused)
        r.acted = time.time()
        if r.action == triage.ACT_DRAIN:
            self.drains.append(r.acted)
        if self.cfg["dry_run"]:
            return self._finish(r, "dry_run", "act.dry_run: not run")
        try:
            if r.action == triage.ACT_RESTART:  # the agent signals only pids that are still the job's ranks
                detail = self.workers.end(r.agent_url, r.labels.get("job", ""), r.labels["node"], r.pids)
            else:
                detail = self.engine.drain(r.labels["node"], f"ranksight: {r.verdict}")
        except ActError as e:
            return self._finish(r, "failed", str(e))
        self._finish(r, "done", detail)
        if r.action == triage.ACT_RESTART:
            threading.Thread(target=self._watch_restart, args=(r,), daemon=True).start()
        return r

    def _drain_refused(self, r: Record) -> Optional[Tuple[str, str]]:
        now = time.time()
        self.drains = [t for t in self.drains if now - t < WINDOW]
        k = self.cfg["max_drains_per_hour"]
        if len(self.drains) >= k:
            return "rate_limited", f"{len(self.drains)} drains in the last hour, act.max_drains_per_hour is {k}"
        node, need = r.labels["node"], self.cfg["job_min_nodes"]
        try:
            jobs = self.engine.job_nodes(node)
        except ActError as e:
            return "failed", f"cannot tell which jobs run on {node}: {e}"
        for job, (nodes, drained) in sorted(jobs.items()):
            left = len(nodes - drained - {node})
            if left < need:
                return "last_nodes", (f"job {job} would keep {left} undrained node(s) of {len(nodes)}, "
                                      f"act.job_min_nodes is {need}")
        return None

    def _watch_restart(self, r: Record) -> None:
        """Recovered when each rank of the job on the node runs in a new process that completed a step."""
        job, node, old = r.labels.get("job", ""), r.labels["node"], set(r.pids)
        first: Dict[int, int] = {}
        deadline = time.time() + RECOVERY_TIMEOUT
        while time.time() < deadline:
            time.sleep(0.25)
            try:
                ranks = self.workers.ranks(r.agent_url, job, node)
            except ActError:
                continue
            fresh = [x for x in ranks if x["pid"] not in old and x.get("up")]
            for x in fresh:
                first.setdefault(x["pid"], x["step"])
            if ranks and len(fresh) == len(ranks) and all(x["step"] > first[x["pid"]] for x in fresh):
                with self.lock:
                    r.recovered = time.time()
                    r.recover_s = round(r.recovered - (r.acted or r.received), 3)
                    self._finish(r, "recovered", f"new pids {sorted(first)} stepping {r.recover_s:g} s after the restart")
                return


def _where(labels: Mapping[str, str]) -> str:
    return " ".join(f"{k}={labels[k]}" for k in ("job", "rank", "node", "gpu", "device", "path") if k in labels)


# ---------------------------------------------------------------- the HTTP server
def _token(path: str) -> bytes:
    try:
        tok = Path(path).read_text(encoding="utf-8").strip().encode()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"config act.token_file: cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    if not tok:
        raise ConfigError(f"config act.token_file: {path} is empty")
    return tok


def _gate(path: str) -> Any:
    """The agent's web-config gate (TLS, client certificates, basic auth), or None without a file."""
    if not path:
        return None
    from ranksight.exporter.webconfig import Gate, WebConfigError, load

    try:
        return Gate(load(path))
    except WebConfigError as e:
        raise ConfigError(f"config act.web_config_file: {e}") from None


def _handler(actor: Actor, token: Optional[bytes], gate: Any) -> type:
    class Handler(BaseHTTPRequestHandler):
        server_version = "ranksight-act"
        timeout = 30

        def setup(self) -> None:
            if gate is not None and gate.tls:
                self.request.settimeout(self.timeout)
                conn = gate.context().wrap_socket(self.request, server_side=True, do_handshake_on_connect=False)
                try:
                    conn.do_handshake()
                    if not gate.san_ok(conn.getpeercert()):
                        raise OSError("client certificate has none of client_allowed_sans")
                except OSError as e:  # ssl.SSLError included: no, or an unverified, client certificate
                    actor.counters.reject("unauthorized")
                    log.warning("act: refused a TLS connection from %s: %s", self.client_address[0], e)
                    conn.close()
                    raise
                self.request = conn
            super().setup()

        def _allowed(self) -> bool:
            header = self.headers.get("Authorization") or ""
            ok = True
            if token is not None:
                given = header[7:].strip().encode() if header[:7].lower() == "bearer " else b""
                ok = hmac.compare_digest(given, token)
            elif gate is not None and gate.wc.users:
                ok = gate.authorized(header)
            if not ok:
                actor.counters.reject("unauthorized")
                log.warning("act: refused a %s %s from %s without valid credentials", self.command, self.path,
                            self.client_address[0])
                self._send(401, {"error": "unauthorized"})
            return ok

        def do_GET(self) -> None:  # noqa: N802 (http.server naming)
            if not self._allowed():
                return
            if self.path == "/metrics":
                self._send(200, actor.counters.render(), "text/plain; version=0.0.4; charset=utf-8")
            elif self.path == ACTIONS_PATH:
                with actor.lock:
                    self._send(200, {"actions": [asdict(r) for r in actor.ledger.records.values()]})
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:  # noqa: N802
            if not self._allowed():
                return
            body = self.rfile.read(min(int(self.headers.get("Content-Length") or 0), 1 << 22))
            if self.path == ALERTS_PATH:
                try:
                    self._send(200, {"results": actor.webhook(json.loads(body or b"null"))})
                except ValueError as e:
                    actor.counters.reject("malformed")
                    self._send(400, {"error": str(e)})
            elif self.path.startswith(APPROVE_PATH):
                try:
                    self._send(200, asdict(actor.approve(self.path[len(APPROVE_PATH):])))
                except KeyError:
                    self._send(404, {"error": f"no action {self.path[len(APPROVE_PATH):]!r} in the ledger"})
            else:
                self._send(404, {"error": "not found"})

        def _send(self, code: int, body: Any, ctype: str = "application/json") -> None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            log.debug("http %s - %s", self.address_string(), format % args)

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:  # logged where it happened
        log.debug("act: connection from %s ended with an error", client_address[0], exc_info=True)


class ActServer:
    """``ranksight act`` in a thread: ``ActServer(cfg).start()``, ``.url``, ``.actor``, ``.stop()``."""

    def __init__(self, cfg: Mapping[str, Any], engine: Optional[Engine] = None) -> None:
        a = cfg["act"]
        token = _token(a["token_file"]) if a["token_file"] else None
        gate = _gate(a["web_config_file"])
        mtls = gate is not None and gate.wc.tls is not None and gate.wc.tls.client_auth_type == "RequireAndVerifyClientCert"
        if token is None and not mtls:
            raise ConfigError("config act.token_file: `ranksight act` needs a bearer token file, or act.web_config_file "
                              "with client_auth_type RequireAndVerifyClientCert")
        host, _, port = a["listen"].rpartition(":")
        if not (host and port.isdigit() and int(port) < 65536):
            raise ConfigError(f"config act.listen: expected host:port, got {a['listen']!r}")
        workers = Workers(a["agent_url"], a["kill_grace_seconds"], a["agent_token_file"], a["agent_ca_file"],
                          a["agent_cert_file"], a["agent_key_file"])
        self.actor = Actor(cfg, engine if engine is not None else make_engine(cfg), workers, Ledger(a["ledger_file"]))
        try:
            self.http = _Server((host.strip("[]"), int(port)), _handler(self.actor, token, gate))
        except OSError as e:
            raise ConfigError(f"config act.listen: cannot listen on {a['listen']}: {e.strerror or e}") from None
        scheme = "https" if gate is not None and gate.tls else "http"
        self.url = f"{scheme}://{host}:{self.http.server_address[1]}"
        self._t = threading.Thread(target=self.http.serve_forever, name="ranksight-act", daemon=True)

    def start(self) -> "ActServer":
        self._t.start()
        return self

    def stop(self) -> None:
        self.http.shutdown()
        self.http.server_close()


# ---------------------------------------------------------------- the CLI
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="ranksight config (default $RANKSIGHT_CONFIG); the act section")
    p.add_argument("--profile", default="default", choices=sorted(cfgmod.PROFILES), help="config profile")
    p.add_argument("verb", nargs="?", default="serve", choices=("serve", "approve", "list"),
                   help="serve (the default): run the webhook receiver on act.listen; approve ID: run a proposed "
                        "action; list: print the ledger")
    p.add_argument("id", nargs="?", help="approve: the action id the log and `list` print")
    p.add_argument("--url", help="approve, list: the running `ranksight act` (default http://<act.listen>)")


def _request(url: str, token_file: str, method: str = "GET") -> Any:
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    if token_file:
        req.add_header("Authorization", "Bearer " + _token(token_file).decode())
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


def run(args: argparse.Namespace) -> int:
    import os

    cfg = cfgmod.load(args.config or os.environ.get("RANKSIGHT_CONFIG"), args.profile)
    a = cfg["act"]
    if args.verb == "serve":
        if args.id:
            return error(f"act serve takes no id, got {args.id!r}")
        server = ActServer(cfg).start()
        modes = {e: server.actor.mode(e) for e, x in server.actor.entries.items() if x.action != triage.ACT_PAGE}
        log.info("ranksight act on %s: engine %s, %s, modes %s", server.url, a["engine"],
                 "dry run" if a["dry_run"] else "acting", modes)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            server.stop()
            return 0
    base = (args.url or f"http://{a['listen']}").rstrip("/")
    try:
        if args.verb == "approve":
            if not args.id:
                return error("act approve needs the action id (`ranksight act list` prints them)")
            r = _request(f"{base}{APPROVE_PATH}{args.id}", a["token_file"], "POST")
            print(f"{r['id']} {r['verdict']} {r['action']}: {r['state']}{': ' + r['detail'] if r['detail'] else ''}")
            return 0 if r["state"] in ("done", "dry_run", "recovered") else 1
        for r in _request(base + ACTIONS_PATH, a["token_file"])["actions"]:
            print(f"{r['id']} {r['verdict']} {_where(r['labels'])} {r['action']} {r['mode']}: {r['state']}"
                  f"{'  ' + r['command'] if r['command'] else ''}")
        return 0
    except urllib.error.HTTPError as e:
        return error(f"act {args.verb}: {base} answered {e.code}: {e.read().decode(errors='replace').strip()[:200]}")
    except (OSError, ValueError) as e:
        return error(f"act {args.verb}: cannot reach `ranksight act` at {base}: {e}")
