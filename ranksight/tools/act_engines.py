"""What `ranksight act` runs (ranksight/tools/act.py decides when): end a job's workers on a node, and
drain a node in the engine the job runs on.

- ``Workers``: the ranks of a job on a node, with their pids, read from the node agent's
  ``/api/v1/ranks`` (each rank's hello carries its pid); ``end()`` sends SIGTERM, then SIGKILL after a
  grace. The elastic launcher (``torchrun --max-restarts``) sees its workers fail and restarts them,
  and they resume from their last checkpoint. Signals reach only processes on this machine, so
  `ranksight act` runs beside the agent of the node whose ranks it ends.
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
import shlex
import signal
import subprocess
import urllib.request
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from ..common.plumbing import wait_until
from ..errors import ConfigError

RANKS_API = "/api/v1/ranks"  # the agent's rank table (exporter/ranks.py RANKS_API)


class ActError(Exception):
    """An action that could not run; the message goes in the ledger and the log."""


# ---------------------------------------------------------------- ending a job's workers
@dataclass
class Workers:
    agent_url: str
    grace: float = 5.0

    def ranks(self, job: str, node: str) -> List[Dict[str, Any]]:
        """The agent's ranks of ``job`` on ``node`` (job, rank, node, pid, up, stalled, step, ...)."""
        try:
            with urllib.request.urlopen(self.agent_url.rstrip("/") + RANKS_API, timeout=5) as r:
                doc = json.load(r)
        except (OSError, ValueError) as e:
            raise ActError(f"cannot read the agent's ranks at {self.agent_url}{RANKS_API}: {e}") from None
        return [r for r in doc.get("ranks", []) if r.get("job") == job and r.get("node") == node]

    @staticmethod
    def command(pids: Sequence[int]) -> str:
        return "kill -TERM " + " ".join(str(p) for p in pids)

    def end(self, pids: Sequence[int]) -> str:
        """SIGTERM every pid, SIGKILL those still alive after the grace. What happened, in words."""
        alive = [p for p in pids if _signal(p, signal.SIGTERM)]
        if not alive:
            raise ActError(f"none of the pids {list(pids)} is running on this machine")
        wait_until(lambda: not any(_alive(p) for p in alive), self.grace, 0.05)
        killed = [p for p in alive if _alive(p) and _signal(p, signal.SIGKILL)]
        return f"SIGTERM to {alive}" + (f", SIGKILL to {killed} after {self.grace:g} s" if killed else "")


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError as e:
        raise ActError(f"cannot signal pid {pid}: {e.strerror}") from None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


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
