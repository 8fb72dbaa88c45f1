"""What `ranksight act` runs (ranksight/tools/act.py decides when): end a job's workers on a node, and
drain a node in the engine the job runs on.

- ``Workers``: the culprit node's agent (act.agent_url, its {label} fields from the alert's labels), over
  HTTPS with act.agent_ca_file, an optional client certificate and the bearer token of
  act.agent_token_file: the job's ranks on the node, with their pids, from its ``/api/v1/ranks``, and
  ``end()``, its ``POST /api/v1/ranks/end``: the agent sends SIGTERM, then SIGKILL after the grace, to
  the processes it tracks as the job's ranks on its node (exporter/workers.py). The elastic launcher
  (``torchrun --max-restarts``) sees its workers fail and restarts them, and they resume from their
  last checkpoint. One `ranksight act` acts on every node.
- ``SlurmEngine``: ``scontrol update NodeName=<node> State=DRAIN Reason="ranksight: <alert>"``; the jobs
  on a node from ``squeue -w``, their nodes from ``scontrol show hostnames``, the drained ones from
  ``sinfo``.
- ``KubeEngine``: cordon (``patch_node`` with ``spec.unschedulable``) and evict the job's pods on the node
  (``create_namespaced_pod_eviction``) through ``KubeApi``, the few ``CoreV1Api`` calls it needs, so a
  test can record them against the real client's signatures.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import ssl
import subprocess
import urllib.error
import urllib.request
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from ..config import AGENT_URL_FIELD
from ..errors import ConfigError

RANKS_API = "/api/v1/ranks"  # the agent's rank table (exporter/ranks.py RANKS_API)
END_API = RANKS_API + "/end"  # the agent's end of a job's workers (exporter/workers.py END_API)


class ActError(Exception):
    """An action that could not run; the message goes in the ledger and the log."""


# ---------------------------------------------------------------- ending a job's workers
class Workers:
    """The culprit node's agent, over HTTPS (or plain HTTP to a loopback one): its ranks, and the end of a
    job's workers there. ``url_template`` is act.agent_url, its {label} fields from the alert's labels."""

    def __init__(self, url_template: str, grace: float = 5.0, token_file: str = "", ca_file: str = "",
                 cert_file: str = "", key_file: str = "") -> None:
        self.template, self.grace = url_template, grace
        self.token_file, self.ca_file, self.cert_file, self.key_file = token_file, ca_file, cert_file, key_file
        self.fixed = not AGENT_URL_FIELD.search(url_template)  # one agent for every alert: a one-node setup
        self.token = _read_token("act.agent_token_file", token_file) if token_file else None
        self.context = _client_context(ca_file, cert_file, key_file)

    def url(self, labels: Mapping[str, str]) -> str:
        """The agent URL for an alert: act.agent_url with each {label} from its labels. ActError when one is
        missing or is no host name, address or port."""
        def field(m: "re.Match[str]") -> str:
            v = labels.get(m.group(1), "")
            if not v or not _URL_VALUE.fullmatch(v):
                raise ActError(f"act.agent_url {self.template}: the alert's label {m.group(1)} is "
                               f"{'missing' if not v else repr(v) + ', no host or port'}")
            return v
        return AGENT_URL_FIELD.sub(field, self.template).rstrip("/")

    def _open(self, url: str, body: Optional[bytes] = None, timeout: float = 10.0) -> Any:
        req = urllib.request.Request(url, data=body, method="POST" if body is not None else "GET")
        if body is not None:
            req.add_header("Content-Type", "application/json")
        if self.token is not None:
            req.add_header("Authorization", "Bearer " + self.token)
        ctx = self.context if url.startswith("https:") else None
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=ctx) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:
            try:
                why = json.loads(e.read() or b"null")["error"]
            except (ValueError, TypeError, KeyError, OSError):
                why = e.reason
            raise ActError(f"agent {url} answered {e.code}: {why}") from None
        except (OSError, ValueError) as e:  # ssl.SSLError and URLError are OSErrors
            raise ActError(f"cannot reach the agent at {url}: {getattr(e, 'reason', None) or e}") from None

    def ranks(self, url: str, job: str, node: str) -> List[Dict[str, Any]]:
        """The agent's ranks of ``job`` on ``node`` (job, rank, node, pid, up, stalled, step, ...)."""
        doc = self._open(url + RANKS_API)
        ranks = doc.get("ranks") if isinstance(doc, dict) else None
        if not isinstance(ranks, list) or not all(isinstance(r, dict) for r in ranks):
            raise ActError(f"{url}{RANKS_API} answered no rank table: is it a ranksight agent?")
        return [r for r in ranks if r.get("job") == job and r.get("node") == node]

    def _body(self, job: str, node: str, pids: Sequence[int]) -> bytes:
        return json.dumps({"job": job, "node": node, "pids": list(pids), "grace": self.grace}).encode()

    def command(self, url: str, job: str, node: str, pids: Sequence[int]) -> str:
        """The curl line that asks the agent what ``end`` asks (the token read from its file)."""
        tls = "".join(f" --{k} {shlex.quote(v)}" for k, v in (("cacert", self.ca_file), ("cert", self.cert_file),
                                                             ("key", self.key_file)) if v)
        auth = f' -H "Authorization: Bearer $(cat {shlex.quote(self.token_file)})"' if self.token_file else ""
        return (f"curl -sS --fail-with-body{tls}{auth} -H 'Content-Type: application/json' "
                f"-d {shlex.quote(self._body(job, node, pids).decode())} {shlex.quote(url + END_API)}")

    def end(self, url: str, job: str, node: str, pids: Sequence[int]) -> str:
        """Ask the agent to end ``pids``, the job's workers on its node (it signals only those it tracks as
        the job's ranks there). What happened, in words."""
        doc = self._open(url + END_API, self._body(job, node, pids), timeout=self.grace + 30)
        if not isinstance(doc, dict) or "detail" not in doc:
            raise ActError(f"{url}{END_API} answered without a detail: is it a ranksight agent?")
        return str(doc["detail"])


_URL_VALUE = re.compile(r"[A-Za-z0-9._:\[\]-]+")  # a label value that may stand in a URL's host or port


def _read_token(key: str, path: str) -> str:
    try:
        tok = open(path, encoding="utf-8").read().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"config {key}: cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    if not tok:
        raise ConfigError(f"config {key}: {path} is empty")
    return tok


def _client_context(ca_file: str, cert_file: str, key_file: str) -> ssl.SSLContext:
    """The TLS client context for the agents: their CA (or the system's) and our client certificate."""
    if bool(cert_file) != bool(key_file):
        raise ConfigError("config act.agent_cert_file and act.agent_key_file: set both or neither")
    try:
        ctx = ssl.create_default_context(cafile=ca_file or None)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"config act.agent_ca_file: cannot load {ca_file}: {getattr(e, 'strerror', None) or e}") \
            from None
    if cert_file:
        try:
            ctx.load_cert_chain(cert_file, key_file)
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(f"config act.agent_cert_file: cannot load {cert_file} with {key_file}: "
                              f"{getattr(e, 'strerror', None) or e}") from None
    return ctx


# ---------------------------------------------------------------- draining a node
class Engine:
    name = "none"

    def drain_command(self, node: str, reason: str) -> str:
        return f"(no engine: set act.engine to slurm or kubernetes to drain {node})"

    def job_nodes(self, node: str) -> Dict[str, Tuple[Set[str], Set[str]]]:
        """job -> (its nodes, those of them already drained), for every job with a process on ``node``."""
        return {}

    def drain(self, node: str, reason: str) -> str:
        raise ActError("no engine configured (act.engine): nothing can drain a node")


class SlurmEngine(Engine):
    name = "slurm"

    def __init__(self, env: Optional[Mapping[str, str]] = None, bindir: str = "") -> None:
        self.env = dict(env) if env is not None else None
        self.bindir = bindir

    def _run(self, *argv: str) -> str:
        exe = os.path.join(self.bindir, argv[0]) if self.bindir else argv[0]
        try:
            r = subprocess.run([exe, *argv[1:]], env=self.env, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise ActError(f"{argv[0]}: {e}") from None
        if r.returncode != 0:
            raise ActError(f"{' '.join(argv[:3])} exited {r.returncode}: {r.stderr.strip()[-300:]}")
        return r.stdout

    def drain_command(self, node: str, reason: str) -> str:
        return f"scontrol update NodeName={shlex.quote(node)} State=DRAIN Reason={shlex.quote(reason)}"

    def _hostnames(self, nodelist: str) -> Set[str]:
        return set(self._run("scontrol", "show", "hostnames", nodelist).split())

    def job_nodes(self, node: str) -> Dict[str, Tuple[Set[str], Set[str]]]:
        jobs = {}
        for line in self._run("squeue", "-h", "-t", "RUNNING", "-w", node, "-o", "%i|%N").splitlines():
            job, _, nodelist = line.strip().partition("|")
            if job:
                jobs[job] = self._hostnames(nodelist)
        if not jobs:
            return {}
        drained = set(self._run("sinfo", "-h", "-N", "-t", "drain,drained,draining", "-o", "%N").split())
        return {job: (nodes, nodes & drained) for job, nodes in jobs.items()}

    def drain(self, node: str, reason: str) -> str:
        self._run("scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")
        return f"node {node} drained in Slurm"


class KubeApi:
    """The CoreV1Api calls the drain makes, one method each, with the real client's arguments."""

    def __init__(self, core: Any = None) -> None:
        if core is None:
            try:
                from kubernetes import client, config
            except ImportError:
                raise ConfigError("act.engine kubernetes needs the kubernetes Python client: "
                                  "pip install kubernetes") from None
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            core = client.CoreV1Api()
        self.core = core

    def cordon(self, node: str) -> None:
        self.core.patch_node(node, {"spec": {"unschedulable": True}})

    def pods(self, node: str, selector: str) -> List[Tuple[str, str, Dict[str, str]]]:
        """(namespace, name, labels, node name) of the pods on ``node`` (every node with node="") matching
        ``selector``."""
        kw: Dict[str, Any] = {"label_selector": selector} if selector else {}
        if node:
            kw["field_selector"] = f"spec.nodeName={node}"
        out = self.core.list_pod_for_all_namespaces(**kw)
        return [(p.metadata.namespace, p.metadata.name, dict(p.metadata.labels or {}), p.spec.node_name)
                for p in out.items]

    def unschedulable(self) -> Set[str]:
        return {n.metadata.name for n in self.core.list_node().items if n.spec.unschedulable}

    def evict(self, namespace: str, name: str) -> None:
        from kubernetes import client

        body = client.V1Eviction(api_version="policy/v1", kind="Eviction",
                                 metadata=client.V1ObjectMeta(name=name, namespace=namespace))
        self.core.create_namespaced_pod_eviction(name, namespace, body)


class KubeEngine(Engine):
    name = "kubernetes"
    JOB_LABELS = ("ranksight.io/job", "job-name", "training.kubeflow.org/job-name", "app")

    def __init__(self, api: KubeApi, selector: str) -> None:
        self.api = api
        self.selector = selector

    def drain_command(self, node: str, reason: str) -> str:
        sel = f" -l {shlex.quote(self.selector)}" if self.selector else ""
        return (f"kubectl cordon {shlex.quote(node)} && kubectl get pods -A --field-selector "
                f"spec.nodeName={shlex.quote(node)}{sel} (each evicted)  # {reason}")

    def _job(self, labels: Mapping[str, str]) -> str:
        return next((labels[k] for k in self.JOB_LABELS if k in labels), "")

    def job_nodes(self, node: str) -> Dict[str, Tuple[Set[str], Set[str]]]:
        jobs = {self._job(lb) for _, _, lb, _ in self.api.pods(node, self.selector)} - {""}
        if not jobs:
            return {}
        every = self.api.pods("", self.selector)
        cordoned = self.api.unschedulable()
        out = {}
        for job in jobs:
            nodes = {n for _, _, lb, n in every if self._job(lb) == job and n}
            out[job] = (nodes, nodes & cordoned)
        return out

    def drain(self, node: str, reason: str) -> str:
        self.api.cordon(node)
        pods = self.api.pods(node, self.selector)
        for ns, name, _, _ in pods:
            self.api.evict(ns, name)
        return f"node {node} cordoned, {len(pods)} pod(s) evicted: " + ", ".join(f"{ns}/{n}" for ns, n, _, _ in pods)


def engine(cfg: Mapping[str, Any]) -> Engine:
    kind = cfg["act"]["engine"]
    if kind == "slurm":
        return SlurmEngine()
    if kind == "kubernetes":
        return KubeEngine(KubeApi(), cfg["act"]["kube_pod_selector"])
    return Engine()
