"""Who this rank is: job, rank, local rank, world size, node, pid, restart count.

job: ``RANKSIGHT_JOB``, else ``TORCHELASTIC_RUN_ID`` (unless torchrun's default
"none"), else ``SLURM_JOB_ID``, else the script name. rank and world size come
from the default process group when one is initialized, else from the launcher's
environment (``RANK``/``WORLD_SIZE``, ``SLURM_PROCID``/``SLURM_NTASKS``), else 0/1.
"""
from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional

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
            rank = _int(env, "RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
            ws = _int(env, "WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
        if rank is None or ws is None or not (1 <= ws <= protocol.MAX_WORLD) or not (0 <= rank < ws):
            rank, ws = 0, 1
        lr = _int(env, "LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")
        if lr is None or not (0 <= lr <= 4095):
            lr = 0
        restart = _int(env, "TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT")
        if restart is None or restart < 0:
            restart = 0
        node = (socket.gethostname() or "unknown")[: protocol.MAX_STR]
        return cls(job=job_name(env, sys.argv[0] if sys.argv else ""), rank=rank, local_rank=lr,
                   world_size=ws, node=node, pid=os.getpid(), restart=restart, from_pg=from_pg)
