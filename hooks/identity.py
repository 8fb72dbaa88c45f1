"""Who this rank is: job, rank, local rank, world size, node, pid, restart count.

job: ``RANKSIGHT_JOB``, else ``TORCHELASTIC_RUN_ID`` (unless torchrun's default
"none"), else ``SLURM_JOB_ID``, else the script name. rank and world size come
from the default process group when one is initialized, else from the launcher's
environment, else 0/1 (the heartbeat thread re-reads them once a process group exists):

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
import socket
import sys
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

from ranksight import protocol


def _int(env: Mapping[str, str], *names: str) -> Optional[int]:
    for n in names:
        v = env.get(n)
        if v is not None:
            try:
                return int(v)
            except ValueError:
                continue
    return None


def job_name(env: Mapping[str, str], argv0: str) -> str:
    for name in ("RANKSIGHT_JOB", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"):
        v = (env.get(name) or "").strip()
        if v and not (name == "TORCHELASTIC_RUN_ID" and v == "none"):
            return v[: protocol.MAX_STR]
    base = os.path.basename(argv0 or "")
    if base.endswith(".py"):
        base = base[:-3]
    if not base or base in ("-c", "-m", "python", "__main__"):
        base = "python"
    return base[: protocol.MAX_STR]


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

    def base(self) -> Dict[str, Any]:
        """The identity fields every datagram carries."""
        return {"v": protocol.VERSION, "job": self.job, "rank": self.rank, "lr": self.local_rank,
                "ws": self.world_size, "node": self.node, "pid": self.pid}

    @classmethod
    def detect(cls, env: Optional[Mapping[str, str]] = None) -> "Identity":
        env = os.environ if env is None else env
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
        lr = _int(env, "LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
        if lr is None or not (0 <= lr <= 4095):
            lr = 0
        restart = _int(env, "TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT")
        if restart is None or restart < 0:
            restart = 0
        node = ((env.get("RANKSIGHT_NODE") or "").strip() or socket.gethostname() or "unknown")[: protocol.MAX_STR]
        return cls(job=job_name(env, sys.argv[0] if sys.argv else ""), rank=rank, local_rank=lr,
                   world_size=ws, node=node, pid=os.getpid(), restart=restart, from_pg=from_pg)
