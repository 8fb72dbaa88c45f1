"""Identity under each launcher: the variables torchrun, ``accelerate launch`` (torchrun
inside), Lightning's own launcher and Slurm ``srun`` set, before any process group exists; a
real ``torchrun --standalone`` job named after its script; and a real torchrun elastic restart
reported to a real agent. (The framework tests check the identity their launchers give through
the agent's labels.)"""
from __future__ import annotations

import os
import sys

import pytest

from integration_workloads.harness import launch, rank_series, torchrun, worker_env  # noqa: E402

from ranksight import catalog  # noqa: E402
from ranksight.hooks.identity import Identity  # noqa: E402

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
WORKER = os.path.join(TESTS, "integration_workloads", "plain_worker.py")

TORCHRUN = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
            "ROLE_RANK": "3", "TORCHELASTIC_RUN_ID": "a1b2", "TORCHELASTIC_RESTART_COUNT": "2",
            "TORCHELASTIC_MAX_RESTARTS": "3", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
SRUN = {"SLURM_JOB_ID": "81234", "SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
        "SLURM_NODEID": "2", "SLURM_NNODES": "4", "SLURM_NTASKS_PER_NODE": "2", "SLURM_RESTART_COUNT": "1"}
LIGHTNING = {"LOCAL_RANK": "1", "NODE_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": "41000"}


STANDALONE = "3e43cde6-94a4-4f5e-9c1d-0b8a2f6d7e51"  # torchrun --standalone: a uuid4 of its own


def ident(env):
    i = Identity.detect(env, argv0="/home/u/train.py")
    return i.job, i.rank, i.local_rank, i.world_size, i.restart


@pytest.mark.parametrize("env, want", [
    (TORCHRUN, ("train-a1b2", 3, 1, 4, 2)),  # --rdzv-id=a1b2, chosen by the user
    (dict(TORCHRUN, TORCHELASTIC_RUN_ID=STANDALONE), ("train", 3, 1, 4, 2)),
    (dict(TORCHRUN, TORCHELASTIC_RUN_ID="none", RANKSIGHT_JOB="named"), ("named", 3, 1, 4, 2)),
    (SRUN, ("train-81234", 5, 1, 8, 1)),
    # torchrun started by srun on each node: torchrun's variables win, the job is Slurm's
    (dict(SRUN, **dict(TORCHRUN, TORCHELASTIC_RUN_ID="none")), ("train-81234", 3, 1, 4, 2)),
    (dict(SRUN, **TORCHRUN), ("train-81234", 3, 1, 4, 2)),
    (LIGHTNING, (None, 1, 1, 2, 0)),
    (dict(LIGHTNING, NODE_RANK="1", LOCAL_WORLD_SIZE="2", WORLD_SIZE="4"), (None, 3, 1, 4, 0)),
    # node 1 without the local world size: unknown until the process group exists
    (dict(LIGHTNING, NODE_RANK="1", WORLD_SIZE="4"), (None, 0, 1, 1, 0)),
    # never a rank from one launcher with a world size from another
    ({"RANK": "3", "SLURM_NTASKS": "8"}, (None, 0, 0, 1, 0)),
    ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0"}, (None, 2, 0, 4, 0)),
])
def test_identity_from_each_launchers_environment(env, want):
    got = ident(env)
    assert got[1:] == want[1:]
    if want[0] is not None:
        assert got[0] == want[0]


@pytest.mark.slow
def test_node_label_from_ranksight_node_else_the_hostname():
    import socket

    assert Identity.detect({"RANKSIGHT_NODE": "gpu-node-7"}).node == "gpu-node-7"  # a pod's spec.nodeName
    assert Identity.detect({"RANKSIGHT_NODE": " "}).node == socket.gethostname()
    assert Identity.detect({}).node == socket.gethostname()


def test_torchrun_standalone_job_is_named_after_its_script(agent):
    """torchrun --standalone makes up a uuid4 rendezvous id per run: the job name leaves it out,
    so every run of plain_worker.py is the job "plain_worker", the same on both ranks."""
    a = agent()
    env = worker_env(a.ingest, "unused")
    del env["RANKSIGHT_JOB"]
    run = launch([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", WORKER,
                  "--steps", "2"], env, timeout=180)
    assert run["rc"] == 0, run["err"][-4000:]
    assert sorted((r["rank"], r["job"]) for r in run["results"]) == [(0, "plain_worker"), (1, "plain_worker")]
    series = rank_series(a.metrics_text(), "plain_worker")
    assert sorted(series) == [0, 1] and all(s[catalog.STEPS.name] == 2 for s in series.values()), series


def test_torchrun_elastic_restart_is_reported(agent):
    """Rank 1 fails at the end of the first attempt; torchrun restarts both ranks once."""
    a = agent()
    run = launch(torchrun(2, max_restarts=1) + [WORKER, "--steps", "3", "--fail-rank", "1"],
                 worker_env(a.ingest, "elastic"), timeout=180)
    assert run["rc"] == 0, run["err"][-4000:]
    last = {r["rank"]: r for r in run["results"] if r["restart"] == 1}
    assert sorted(last) == [0, 1] and all(r["world"] == 2 and r["local_rank"] == r["rank"] for r in last.values())
    assert all(r["model"] == "DistributedDataParallel" for r in last.values())
    series = rank_series(a.metrics_text(), "elastic")
    assert sorted(series) == [0, 1]
    for rank in (0, 1):
        assert series[rank][catalog.RANK_RESTARTS.name] == 1, series[rank]
        assert series[rank][catalog.RANK_FINISHED.name] == 1
