"""Setup lints on real 2-rank gloo jobs.

Six jobs run once per module (tests/lint_workloads/lint_worker.py): a right setup (GOOD), one
with all nine mistakes (BAD), BAD with eight lints turned off (OFF), an iterable dataset that
every rank reads whole plus a manual data-parallel model initialised per rank (ITER_SAME), a
sharded iterable dataset (ITER_SHARDED) and a map-style job without a DistributedSampler whose
checkpoint is split over files and whose checkpoint filesystem is nearly full (VARIANT).
Every assertion reads the lint datagrams a real UDP receiver decoded with
ranksight.protocol.decode, and the ranks' log lines. Budget: under 3 minutes on 2 cores.
"""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Dict

import pytest

from prometheus_client.parser import text_string_to_metric_families

from ranksight import catalog, triage
from ranksight.hooks.lints import Lints, ranges
from ranksight.tools.stack import AgentProcess

from lint_workloads.harness import Job, run_job  # noqa: E402

BUS = "0000:18:00.0"
ALL = tuple(triage.LINTS)
WORKER_BUDGET = 400e6  # bytes of workers' private memory allowed on the node in these jobs


def _fake_sysfs(root: str, gpu_node: int) -> str:
    """A sysfs tree with two NUMA nodes: node 0 holds exactly this process's CPU affinity, node 1
    CPUs outside it; the GPU at BUS is attached to ``gpu_node``."""
    aff = os.sched_getaffinity(0)
    other = set(range(max(aff) + 1, max(aff) + 9))
    os.makedirs(os.path.join(root, "bus/pci/devices", BUS))
    with open(os.path.join(root, "bus/pci/devices", BUS, "numa_node"), "w") as f:
        f.write(f"{gpu_node}\n")
    for n, cpus in ((0, aff), (1, other)):
        os.makedirs(os.path.join(root, f"devices/system/node/node{n}"))
        with open(os.path.join(root, f"devices/system/node/node{n}/cpulist"), "w") as f:
            f.write(ranges(cpus) + "\n")
    return root


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> Dict[str, Job]:
    base = tmp_path_factory.mktemp("lints")
    good_sys = _fake_sysfs(str(base / "sys-good"), 0)
    bad_sys = _fake_sysfs(str(base / "sys-bad"), 1)
    budget, _ = Lints._memory_budget()
    share = f"{WORKER_BUDGET / budget:.6f}"
    mem = {"RANKSIGHT__thresholds__lint_workers_host_mem_share": share}
    ck = {}
    for name in ("good", "bad", "off", "iter", "variant"):
        ck[name] = str(base / f"ckpt-{name}")
        os.makedirs(ck[name])
    bad_args = ["--replicas", "1", "--n", "100", "--no-set-epoch", "--seed-by-rank", "--perturb-rank", "1",
                "--workers", "1", "--worker-alloc-mb", "300", "--numa-sysfs", bad_sys,
                "--numa-bus", BUS]
    bad_env = dict(mem, RANKSIGHT__thresholds__lint_min_free_bytes="1e15")
    specs = {
        "good": (["--accum", "2", "--scheduler", "--ckpt", "full", "--workers", "1", "--wait-memory",
                  "--numa-sysfs", good_sys, "--numa-bus", BUS, "--ckpt-dir", ck["good"]],
                 dict(mem, RANKSIGHT__thresholds__lint_min_free_bytes="1000")),
        "bad": (bad_args + ["--wait-memory", "--ckpt", "model-only", "--ckpt-dir", ck["bad"]], bad_env),
        "off": (bad_args + ["--ckpt", "model-only", "--ckpt-dir", ck["off"]],
                dict(bad_env, **{f"RANKSIGHT__lints__{k}": "false" for k in ALL if k != "global_batch_lr"})),
        "iter_same": (["--data", "stream-same", "--wrap", "manual", "--init-seed-by-rank",
                       "--ckpt", "timer-model-only", "--ckpt-dir", ck["iter"]],
                      {"RANKSIGHT__thresholds__lint_min_free_bytes": "1000"}),
        "iter_sharded": (["--data", "stream-sharded"],
                         {"RANKSIGHT__thresholds__lint_min_free_bytes": "1000",
                          "RANKSIGHT__lints__global_batch_lr": "false"}),
        "variant": (["--sampler", "random", "--scheduler", "--ckpt", "split", "--ckpt-dir", ck["variant"],
                     "--fake-free", "100"], {"RANKSIGHT__thresholds__lint_min_free_bytes": "1000"}),
    }
    agent = AgentProcess(base / "agent", collectors="ranks", name="agent").start()
    try:
        # three jobs at a time: most of a job is waiting (startup, rendezvous, the lints' periodic checks)
        with ThreadPoolExecutor(max_workers=3) as pool:
            futs = {name: pool.submit(run_job, a, env=dict(e, RANKSIGHT_JOB=f"lints-{name}"), timeout=150.0,
                                      forward=agent.ingest_port) for name, (a, e) in specs.items()}
            out = {name: f.result() for name, f in futs.items()}
        want = _sent_states(out)
        deadline = time.monotonic() + 15.0
        while True:  # the agent's ingest thread may lag behind on a loaded machine
            text = agent.metrics_text()
            if _agent_states(text) == want or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        out["_metrics"] = text  # type: ignore[assignment]
    finally:
        agent.stop()
    return out


def _last_states(jobs: Dict[str, Job]) -> Dict[tuple, bool]:
    """(job, rank, lint) -> the last state each rank sent."""
    last = {}
    for jname, job in _jobs(jobs).items():
        for r in job.records:
            if r["t"] == "lint":
                last[(f"lints-{jname}", str(r["rank"]), r["lint"])] = bool(r["active"])
    return last


def _sent_states(jobs: Dict[str, Job]) -> Dict[tuple, float]:
    """What the agent must expose: 1 for each (job, rank, lint) whose last state was active; a lint
    last sent fine has no series."""
    return {k: 1.0 for k, active in _last_states(jobs).items() if active}


def _agent_states(text: str) -> Dict[tuple, float]:
    name = str(catalog.LINT_ACTIVE)
    got = {}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            if smp.name == name:
                got[(smp.labels["job"], smp.labels["rank"], smp.labels["lint"])] = smp.value
    return got


def fired(job: Job, lint: str, rank: int, text: str = "", findings: int = 1) -> None:
    """The lint was sent active on ``rank`` and logged there once per distinct finding (not per
    step or per check), with ``text`` in a datagram and in a line."""
    on = [r for r in job.lints(lint, rank) if r["active"]]
    assert on, f"{lint} not sent active on rank {rank}\n{job.describe()}"
    assert any(text in r["msg"] for r in on), ([r["msg"] for r in on], text)
    lines = job.lines(lint, rank)
    assert len(lines) == findings, f"{lint} on rank {rank}: {len(lines)} log lines\n{job.describe()}"
    assert any(text in ln for ln in lines), (lines, text)


def quiet(job: Job, lint: str, rank: int, checked: bool = True) -> None:
    """Never sent active nor logged on ``rank``; with ``checked`` it was sent inactive (checked, fine)."""
    got = job.lints(lint, rank)
    assert not [r for r in got if r["active"]], f"{lint} active on rank {rank}\n{job.describe()}"
    assert not job.lines(lint, rank), job.lines(lint, rank)
    if checked:
        assert got and got[-1]["active"] is False, f"{lint} never checked on rank {rank}\n{job.describe()}"


def _jobs(jobs: Dict[str, Job]) -> Dict[str, Job]:
    return {k: v for k, v in jobs.items() if not k.startswith("_")}


def test_jobs_ran_clean(jobs):
    for name, job in _jobs(jobs).items():
        assert not job.invalid, (name, job.invalid)
        for r in job.ranks:
            assert r["rc"] == 0 and r["result"] is not None, f"{name}\n{job.describe()}"
            assert r["result"]["herr"] == 0 and r["result"]["idle"], f"{name}\n{job.describe()}"


def test_io_amplification(jobs):
    for rank in (0, 1):
        fired(jobs["bad"], "io_amplification", rank, "DistributedSampler(num_replicas=1) under world size 2")
        fired(jobs["variant"], "io_amplification", rank, "DataLoader with a RandomSampler (no DistributedSampler)")
        fired(jobs["iter_same"], "io_amplification", rank, "all 2 ranks got the same first batch from the IterableDataset")
        quiet(jobs["good"], "io_amplification", rank)
        quiet(jobs["iter_sharded"], "io_amplification", rank)


def test_sampler_epoch(jobs):
    for rank in (0, 1):
        fired(jobs["bad"], "sampler_epoch", rank, "set_epoch() was not called")
        quiet(jobs["good"], "sampler_epoch", rank)


def test_rank_disagreement(jobs):
    for rank in (0, 1):
        peer = 1 - rank
        # two findings, one line each: the sampler seeds, then the parameters at the first step
        fired(jobs["bad"], "rank_disagreement", rank, f"DistributedSampler seed {rank} vs {peer}", findings=2)
        fired(jobs["bad"], "rank_disagreement", rank, f"parameters differ between rank {rank} and rank {peer}",
              findings=2)
        fired(jobs["iter_same"], "rank_disagreement", rank, "the model is not DDP-wrapped")
        quiet(jobs["good"], "rank_disagreement", rank)
        quiet(jobs["iter_sharded"], "rank_disagreement", rank)
    # DDP broadcast at construction; rank 1 changed a weight afterwards: named in the message
    msgs = [r["msg"] for r in jobs["bad"].lints("rank_disagreement", 1) if r["active"]]
    assert any("'module.2.weight'" in m and "DDP broadcast" in m for m in msgs), msgs


def test_dataloader_workers_rss(jobs):
    for rank in (0, 1):
        fired(jobs["bad"], "dataloader_workers_rss", rank, "summed over the 2 rank(s) of this node")
        quiet(jobs["good"], "dataloader_workers_rss", rank)


def test_numa_binding(jobs):
    aff = ranges(os.sched_getaffinity(0))
    for rank in (0, 1):
        fired(jobs["bad"], "numa_binding", rank, f"CPU affinity {aff} excludes every CPU of NUMA node 1")
        quiet(jobs["good"], "numa_binding", rank)
        # CPU-only jobs (no GPU in use): nothing to check, nothing sent
        quiet(jobs["iter_sharded"], "numa_binding", rank, checked=False)
        assert not jobs["iter_sharded"].lints("numa_binding", rank)


def test_uneven_last_batch(jobs):
    for rank in (0, 1):
        fired(jobs["bad"], "uneven_last_batch", rank,
              "100 samples per rank (100 in the dataset, 1 data-parallel rank) is not a multiple of batch size 16: every epoch "
              "ends with a partial step of 4 samples")
        quiet(jobs["good"], "uneven_last_batch", rank)


def test_incomplete_checkpoint(jobs):
    fired(jobs["bad"], "incomplete_checkpoint", 0,
          "holds model weights but lacks: optimizer state, CPU RNG state, sampler/data position, step counter;")
    fired(jobs["iter_same"], "incomplete_checkpoint", 0,
          "(timer)) holds model weights but lacks: optimizer state, CPU RNG state, sampler/data position;")
    # atomic_save of everything plus a weights-only export in the same round; a checkpoint split over files
    quiet(jobs["good"], "incomplete_checkpoint", 0)
    quiet(jobs["variant"], "incomplete_checkpoint", 0)
    for name in ("bad", "good"):  # rank 1 saves nothing
        assert not jobs[name].lints("incomplete_checkpoint", 1)


def batch_line(job: Job, rank: int, text: str, gbatch: int) -> None:
    """global_batch_lr is not raised by the rank: one info line, and one inactive datagram carrying
    the global batch and the base LR, from which the agent raises it when the batch changed across
    restarts but the LR did not (exporter tests cover that side)."""
    got = job.lints("global_batch_lr", rank)
    assert len(got) == 1 and got[0]["active"] is False, f"{got}\n{job.describe()}"
    assert text in got[0]["msg"] and got[0]["gbatch"] == gbatch and got[0]["lrate"] > 0, (got, text)
    lines = job.lines("global_batch_lr", rank)
    assert len(lines) == 1 and text in lines[0], lines


def test_global_batch_lr(jobs):
    batch_line(jobs["good"], 0,
               "global batch 64 samples = 16 samples per rank x 2 data-parallel ranks x 2 accumulation steps "
               "(forwards per optimizer step); "
               "lr 0.05", 64)
    batch_line(jobs["bad"], 0, "global batch 16 samples = 16 samples per rank x 1 data-parallel ranks x 1 accumulation", 16)
    batch_line(jobs["iter_same"], 0, "global batch 32 samples = 16 samples per rank x 2 data-parallel ranks x 1", 32)
    for name in ("good", "bad"):  # one line per job, from rank 0
        quiet(jobs[name], "global_batch_lr", 1, checked=False)
    quiet(jobs["iter_sharded"], "global_batch_lr", 0, checked=False)  # lints.global_batch_lr: false
    assert not jobs["iter_sharded"].lints("global_batch_lr")


def test_disk_headroom(jobs):
    fired(jobs["bad"], "disk_headroom", 0, "less free space than thresholds.lint_min_free_bytes before the first checkpoint")
    fired(jobs["variant"], "disk_headroom", 0, "less free space than 2 x the largest checkpoint")
    assert "has 100 B free" in jobs["variant"].lines("disk_headroom", 0)[0] or \
        "has 0.1 kB free" in jobs["variant"].lines("disk_headroom", 0)[0]
    quiet(jobs["good"], "disk_headroom", 0)
    quiet(jobs["iter_sharded"], "disk_headroom", 0)


def test_each_lint_turns_off(jobs):
    off = jobs["off"]
    for lint in ALL:
        if lint == "global_batch_lr":
            continue
        for rank in (0, 1):
            assert not off.lints(lint, rank) and not off.lines(lint, rank), f"{lint}\n{off.describe()}"
    batch_line(off, 0, "global batch 16 samples", 16)  # the one left on still runs


def test_agent_exposes_each_lint_as_sent(jobs):
    """The real agent, fed the same datagrams, exposes ranksight_lint_active{lint} = 1 for each lint
    whose last state on the rank was active, and no series for a lint last found fine."""
    got, want = _agent_states(jobs["_metrics"]), _sent_states(jobs)
    fine = [k for k, active in _last_states(jobs).items() if not active]
    assert want and fine and got == want
    assert got[("lints-bad", "1", "numa_binding")] == 1.0 and ("lints-good", "1", "numa_binding") in fine
    assert not set(fine) & set(got), "a lint checked and found fine is not exposed"
