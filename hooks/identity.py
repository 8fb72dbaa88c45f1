"""Who this rank is: job, rank, local rank, world size, node, pid, restart count.

job (``job_name``): ``RANKSIGHT_JOB``; else a name every rank of one job derives alike from what
they share (the environment and the command line), stable across restarts and runs:

* the script's name (``train`` for ``train.py``; the module for ``python -m pkg.train``),
* joined with ``-`` to the Slurm job id under Slurm (``train-81234``: one id per allocation,
  kept by a requeue, shared by every node), else to torchrun's rendezvous id when the user chose
  one (``--rdzv-id=myrun``: ``train-myrun``). torchrun's own ids are left out: ``none`` (its default)
  and the random uuid4 that ``--standalone`` and a one-node c10d rendezvous make up, which would
  make every run a new job without a history.

A job name is a Prometheus label value: the derived parts keep letters, digits, ``_``, ``.`` and
``-`` (a run of any other characters becomes one ``_``), at most ``PART_MAX`` characters each;
``RANKSIGHT_JOB`` is taken as given, without control characters and at most ``protocol.MAX_STR``
long. ``job_line`` says which name is used and how to choose another.

rank and world size come from the default process group when one is initialized, else from the
launcher's environment, else 0/1 (the heartbeat thread re-reads them once a process group exists):

* torchrun, ``accelerate launch`` (torchrun inside), torchrun under srun: ``RANK``/``WORLD_SIZE``;
* Slurm ``srun`` (one task per rank): ``SLURM_PROCID``/``SLURM_NTASKS``, ``SLURM_LOCALID``;
* Open MPI and PMI launchers: ``OMPI_COMM_WORLD_*``, ``PMI_RANK``/``PMI_SIZE``;
* Lightning's own launcher (``python train.py`` with devices=N): ``LOCAL_RANK``, ``NODE_RANK``
  and ``WORLD_SIZE`` but no ``RANK``; the rank is ``NODE_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK``
  where the local world size is known (``LOCAL_WORLD_SIZE``, or a single node), else it waits
  for the process group.

node: ``RANKSIGHT_NODE`` (a Kubernetes pod sets it to its node's name from the downward API, as
the agent's ``--node`` is), else the hostname.

A pair (rank, world size) is taken from one launcher's variables, never mixed. restart:
``TORCHELASTIC_RESTART_COUNT`` (torchrun elastic restarts), else ``SLURM_RESTART_COUNT`` (requeues).
"""
from __future__ import annotations

import os
import re
import socket
import sys
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

from ranksight import protocol

PART_MAX = 63  # a derived name's parts (script, id): two and the "-" fit protocol.MAX_STR
_UUID4 = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", re.IGNORECASE)
_UNSAFE = re.compile(r"[^\w.-]+")  # (\w: letters, digits and "_" of any script)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
SOURCE_ENV = "RANKSIGHT_JOB"


def _int(env: Mapping[str, str], *names: str) -> Optional[int]:
    for n in names:
        v = env.get(n)
        if v is not None:
            try:
                return int(v)
            except ValueError:
                continue
    return None


def _part(s: str) -> str:
    """``s`` as a bounded label-value part: runs of other characters become ``_``, no ``._-`` at the ends."""
    return _UNSAFE.sub("_", s.strip()).strip("._-")[:PART_MAX].rstrip("._-")


def chosen_run_id(env: Mapping[str, str]) -> str:
    """torchrun's rendezvous id (``TORCHELASTIC_RUN_ID``) when the user chose it, else ""."""
    v = (env.get("TORCHELASTIC_RUN_ID") or "").strip()
    return "" if v == "none" or _UUID4.fullmatch(v) else v


def main_module() -> Optional[str]:
    """The module ``python -m`` runs (``pkg.train``; ``pkg`` for ``pkg/__main__.py``), else None."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    name = getattr(spec, "name", None)
    if not isinstance(name, str) or not name or name == "__main__":
        return None
    return name[: -len(".__main__")] if name.endswith(".__main__") else name


def script_name(argv0: str, module: Optional[str] = None) -> Tuple[str, str]:
    """(name, where it came from): the module run with ``-m``, else the script's file name without
    .py (its folder's name for a ``__main__.py``); "python" for ``python -c`` and stdin."""
    if module and _part(module):
        return _part(module), "the module name"
    path = (argv0 or "").rstrip("/")
    base = os.path.basename(path)
    if base == "__main__.py":
        base = os.path.basename(os.path.dirname(path))
    for ext in (".py", ".pyz"):
        if base.endswith(ext):
            base = base[: -len(ext)]
    if base in ("-", "-c", "-m") or not _part(base):
        return "python", "the interpreter"
    return _part(base), "the script name"


def job_source(env: Mapping[str, str], argv0: str, module: Optional[str] = None) -> Tuple[str, str]:
    """(job name, where it came from; ``SOURCE_ENV`` when the user set it). ``module``: the module
    ``python -m`` runs (``main_module()``), None for a script."""
    given = _CONTROL.sub("", env.get(SOURCE_ENV) or "").strip()[: protocol.MAX_STR].strip()
    if given:
        return given, SOURCE_ENV
    base, where = script_name(argv0, module)
    tag, what = _part(env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or ""), "the Slurm job id"
    if not tag:
        tag, what = _part(chosen_run_id(env)), "torchrun's --rdzv-id"
    if not tag:
        return base, where
    return (base if tag == base else f"{base}-{tag}"), f"{where} and {what}"


def job_name(env: Mapping[str, str], argv0: str, module: Optional[str] = None) -> str:
    """The job name ``job_source`` derives."""
    return job_source(env, argv0, module)[0]


def job_line(job: str, source: str) -> str:
    """One line for the log: which job name is used and how to choose another."""
    if source == SOURCE_ENV:
        return f"job name {job!r} (from {SOURCE_ENV})"
    return f"job name {job!r} (from {source}; set {SOURCE_ENV} to choose)"


def local_rank(env: Mapping[str, str]) -> int:
    """The node-local rank the launcher's environment gives, else 0."""
    lr = _int(env, "LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
    return lr if lr is not None and 0 <= lr <= 4095 else 0


# (rank, world size) variable pairs, in the order they are tried
RANK_PAIRS = (("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS"),
              ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"))


def launcher_rank(env: Mapping[str, str]) -> Tuple[Optional[int], Optional[int]]:
    """(rank, world size) from the launcher's environment, (None, None) when it does not say."""
    for r_name, ws_name in RANK_PAIRS:
        rank, ws = _int(env, r_name), _int(env, ws_name)
        if rank is not None and ws is not None:
            return rank, ws
    lr, ws = _int(env, "LOCAL_RANK"), _int(env, "WORLD_SIZE")  # Lightning's launcher
    if lr is not None and ws is not None:
        node = _int(env, "NODE_RANK", "GROUP_RANK") or 0
        local_world = _int(env, "LOCAL_WORLD_SIZE")
        if local_world is not None:
            return node * local_world + lr, ws
        if node == 0:
            return lr, ws
    return None, None


@dataclass(frozen=True)
class Identity:
    job: str
    rank: int
    local_rank: int
    world_size: int
    node: str
    pid: int
    restart: int
    from_pg: bool  # rank/world size came from an initialized process group
    job_from: str = SOURCE_ENV  # where the job name came from (job_source)

    def base(self) -> Dict[str, Any]:
        """The identity fields every datagram carries."""
        return {"v": protocol.VERSION, "job": self.job, "rank": self.rank, "lr": self.local_rank,
                "ws": self.world_size, "node": self.node, "pid": self.pid}

    def job_line(self) -> str:
        """"job name 'train' (from the script name; set RANKSIGHT_JOB to choose)"."""
        return job_line(self.job, self.job_from)

    @classmethod
    def detect(cls, env: Optional[Mapping[str, str]] = None, argv0: Optional[str] = None,
               module: Optional[str] = None) -> "Identity":
        """This process's identity. ``argv0``/``module``: the command line the job name is derived
        from (default: ``sys.argv[0]`` and ``main_module()``)."""
        env = os.environ if env is None else env
        if argv0 is None:
            argv0, module = (sys.argv[0] if sys.argv else ""), main_module()
        rank = ws = None
        from_pg = False
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                rank, ws, from_pg = dist.get_rank(), dist.get_world_size(), True
        except Exception:  # a half-torn-down process group: use the environment
            rank = ws = None
        if rank is None or ws is None or rank < 0:
            rank, ws = launcher_rank(env)
        if rank is None or ws is None or not (1 <= ws <= protocol.MAX_WORLD) or not (0 <= rank < ws):
            rank, ws = 0, 1
        lr = local_rank(env)
        restart = _int(env, "TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT")
        if restart is None or restart < 0:
            restart = 0
        node = ((env.get("RANKSIGHT_NODE") or "").strip() or socket.gethostname() or "unknown")[: protocol.MAX_STR]
        job, job_from = job_source(env, argv0, module)
        return cls(job=job, rank=rank, local_rank=lr, world_size=ws, node=node, pid=os.getpid(), restart=restart,
                   from_pg=from_pg, job_from=job_from)
